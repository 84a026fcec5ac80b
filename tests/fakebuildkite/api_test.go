package fakebuildkite

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const oneStep = "steps:\n  - command: echo hi\n    key: one\n"

// TestTokenKinds checks that each endpoint takes exactly one kind of token and answers 401 to
// the others, as Buildkite does.
func TestTokenKinds(t *testing.T) {
	s := startFake(t, Options{})
	a, j := startedJob(t, s, oneStep)
	_, other := startedJob(t, s, oneStep)
	reg := s.RegistrationToken()

	tests := []struct {
		name   string
		method string
		path   string
		token  string
		body   any
		want   int
	}{
		{"register with registration token", "POST", "/register", reg, map[string]any{"name": "x"}, 201},
		{"register with access token", "POST", "/register", a.token, map[string]any{"name": "x"}, 401},
		{"register with job token", "POST", "/register", j.Token, map[string]any{"name": "x"}, 401},
		{"register without token", "POST", "/register", "", map[string]any{"name": "x"}, 401},
		{"register with wrong token", "POST", "/register", "nope", map[string]any{"name": "x"}, 401},
		{"ping with access token", "GET", "/ping", a.token, nil, 200},
		{"ping with registration token", "GET", "/ping", reg, nil, 401},
		{"ping with job token", "GET", "/ping", j.Token, nil, 401},
		{"heartbeat with job token", "POST", "/heartbeat", j.Token, map[string]string{"sent_at": "x"}, 401},
		{"heartbeat with access token", "POST", "/heartbeat", a.token, map[string]string{"sent_at": "x"}, 200},
		{"connect with registration token", "POST", "/connect", reg, nil, 401},
		{"accept with job token", "PUT", "/jobs/" + j.ID + "/accept", j.Token, nil, 401},
		{"accept with registration token", "PUT", "/jobs/" + j.ID + "/accept", reg, nil, 401},
		{"job state with job token", "GET", "/jobs/" + j.ID, j.Token, nil, 200},
		{"job state with access token", "GET", "/jobs/" + j.ID, a.token, nil, 401},
		{"job state with another job's token", "GET", "/jobs/" + j.ID, other.Token, nil, 401},
		{"job state of unknown job", "GET", "/jobs/" + newUUID(), j.Token, nil, 404},
		{"start with access token", "PUT", "/jobs/" + j.ID + "/start", a.token, map[string]string{}, 401},
		{"finish with access token", "PUT", "/jobs/" + j.ID + "/finish", a.token, map[string]string{"exit_status": "0"}, 401},
		{"meta-data with access token", "POST", "/jobs/" + j.ID + "/data/set", a.token, map[string]string{"key": "k", "value": "v"}, 401},
		{"meta-data with job token", "POST", "/jobs/" + j.ID + "/data/set", j.Token, map[string]string{"key": "k", "value": "v"}, 201},
		{"build meta-data with access token", "POST", "/builds/" + j.Env["BUILDKITE_BUILD_ID"] + "/data/keys", a.token, nil, 401},
		{"pipeline upload with access token", "POST", "/jobs/" + j.ID + "/pipelines?async=true", a.token, map[string]any{"uuid": newUUID(), "pipeline": map[string]any{"steps": []any{}}}, 401},
		{"artifacts with access token", "POST", "/jobs/" + j.ID + "/artifacts", a.token, map[string]any{"id": "b"}, 401},
		{"annotate with access token", "POST", "/jobs/" + j.ID + "/annotations", a.token, map[string]string{"body": "x"}, 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, s, tt.method, tt.path, tt.token, tt.body)
			assert.Equal(t, tt.want, r.status, "body: %s", r.body)
			if tt.want >= 400 {
				assert.NotEmpty(t, r.message(t), "errors carry {\"message\": ...}")
			}
		})
	}
}

func TestTokensAreDistinctAndShaped(t *testing.T) {
	s := startFake(t, Options{})
	a, j := startedJob(t, s, oneStep)
	assert.True(t, strings.HasPrefix(j.Token, "bkaj_"), "job tokens start with bkaj_")
	assert.NotEqual(t, a.token, j.Token)
	assert.NotEqual(t, s.RegistrationToken(), a.token)
}

func TestRevokedAgentGets401(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "r", "queue=default")
	require.Equal(t, ActionIdle, ping(t, s, a).Action)
	s.RevokeAgent(a.id)
	for _, ep := range []struct{ method, path string }{{"GET", "/ping"}, {"POST", "/heartbeat"}, {"POST", "/disconnect"}} {
		r := call(t, s, ep.method, ep.path, a.token, map[string]string{})
		assert.Equal(t, http.StatusUnauthorized, r.status, "%s %s", ep.method, ep.path)
	}
	snap, ok := s.Agent(a.id)
	require.True(t, ok)
	assert.True(t, snap.Revoked)
}

func TestAcceptRules(t *testing.T) {
	type setup struct {
		s        *Server
		owner    testAgent // the agent the job was offered to
		intruder testAgent
		jobID    string
	}
	mk := func(t *testing.T) setup {
		s := startFake(t, Options{})
		b, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
		require.NoError(t, err)
		owner := registerAgent(t, s, "owner", "queue=default")
		intruder := registerAgent(t, s, "intruder", "queue=default")
		p := ping(t, s, owner)
		require.NotNil(t, p.Job)
		require.Equal(t, b.Jobs[0], p.Job.ID)
		return setup{s: s, owner: owner, intruder: intruder, jobID: b.Jobs[0]}
	}
	tests := []struct {
		name    string
		prepare func(t *testing.T, su setup)
		who     func(su setup) testAgent
		want    int
		message string
	}{
		{"owner accepts", func(*testing.T, setup) {}, func(su setup) testAgent { return su.owner }, 200, ""},
		{"another agent accepts an assigned job", func(*testing.T, setup) {}, func(su setup) testAgent { return su.intruder }, 422, "Job has already been assigned to another agent"},
		{"another agent accepts an accepted job", func(t *testing.T, su setup) {
			r := call(t, su.s, "PUT", "/jobs/"+su.jobID+"/accept", su.owner.token, nil)
			require.Equal(t, 200, r.status)
		}, func(su setup) testAgent { return su.intruder }, 422, "Job has already been accepted by another agent"},
		{"owner accepts again (a retry)", func(t *testing.T, su setup) {
			r := call(t, su.s, "PUT", "/jobs/"+su.jobID+"/accept", su.owner.token, nil)
			require.Equal(t, 200, r.status)
		}, func(su setup) testAgent { return su.owner }, 200, ""},
		{"accept a canceled job", func(t *testing.T, su setup) {
			require.NoError(t, su.s.CancelJob(su.jobID))
		}, func(su setup) testAgent { return su.owner }, 422, "Job has already been canceled"},
		{"accept a finished job", func(t *testing.T, su setup) {
			r := call(t, su.s, "PUT", "/jobs/"+su.jobID+"/accept", su.owner.token, nil)
			var j acceptedJob
			r.json(t, &j)
			require.Equal(t, 200, call(t, su.s, "PUT", "/jobs/"+su.jobID+"/start", j.Token, map[string]string{}).status)
			require.Equal(t, 200, call(t, su.s, "PUT", "/jobs/"+su.jobID+"/finish", j.Token, map[string]any{"exit_status": "0"}).status)
		}, func(su setup) testAgent { return su.intruder }, 422, "Job has already finished"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			su := mk(t)
			tt.prepare(t, su)
			r := call(t, su.s, "PUT", "/jobs/"+su.jobID+"/accept", tt.who(su).token, nil)
			require.Equal(t, tt.want, r.status, "body: %s", r.body)
			if tt.message != "" {
				assert.Equal(t, tt.message, r.message(t))
			}
		})
	}

	t.Run("a job not offered to the agent", func(t *testing.T) {
		s := startFake(t, Options{})
		b, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
		require.NoError(t, err)
		a := registerAgent(t, s, "a", "queue=default")
		r := call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/accept", a.token, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status)
		r = call(t, s, "PUT", "/jobs/"+newUUID()+"/accept", a.token, nil)
		assert.Equal(t, http.StatusNotFound, r.status)
	})
}

func TestAcceptReturnsTheJob(t *testing.T) {
	s := startFake(t, Options{ChunksMaxSizeBytes: 4096})
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - commands: [\"echo a\", \"echo b\"]\n    label: L\n    key: k\n    agents: {queue: q, os: linux}\n"})
	require.NoError(t, err)
	a := registerAgent(t, s, "agent-1", "queue=q", "os=linux", "node-pool=big")
	j := takeJob(t, s, a)
	assert.Equal(t, StateAccepted, j.State)
	assert.Equal(t, int64(4096), j.ChunksMaxSizeBytes)
	assert.Equal(t, "echo a\necho b", j.Env["BUILDKITE_COMMAND"])
	assert.Equal(t, a.id, j.Env["BUILDKITE_AGENT_ID"])
	assert.Equal(t, "agent-1", j.Env["BUILDKITE_AGENT_NAME"])
	assert.Equal(t, "q", j.Env["BUILDKITE_AGENT_META_DATA_QUEUE"])
	assert.Equal(t, "big", j.Env["BUILDKITE_AGENT_META_DATA_NODE_POOL"])
	assert.JSONEq(t, `{"key":"k","label":"L","command":"echo a\necho b","agents":{"os":"linux","queue":"q"}}`, string(j.Step))
	snap, _ := s.Job(j.ID)
	assert.Equal(t, a.id, snap.AcceptedBy)
	assert.Equal(t, 1, snap.AcceptCount)
}

func TestStartAndStates(t *testing.T) {
	s := startFake(t, Options{})
	_, j := startedJob(t, s, oneStep)
	r := call(t, s, "GET", "/jobs/"+j.ID, j.Token, nil)
	require.Equal(t, 200, r.status)
	assert.JSONEq(t, `{"state":"running"}`, string(r.body))

	// A retried start changes nothing.
	r = call(t, s, "PUT", "/jobs/"+j.ID+"/start", j.Token, map[string]string{})
	assert.Equal(t, 200, r.status)
	snap, _ := s.Job(j.ID)
	assert.Equal(t, StateRunning, snap.State)
	assert.Equal(t, 2, snap.StartCount)
}

func TestStartOfCanceledJobIs422(t *testing.T) {
	s := startFake(t, Options{})
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
	require.NoError(t, err)
	a := registerAgent(t, s, "a", "queue=default")
	j := takeJob(t, s, a)
	require.NoError(t, s.CancelJob(j.ID))
	snap, _ := s.Job(j.ID)
	require.Equal(t, StateCanceled, snap.State, "a job not yet started is canceled at once")
	r := call(t, s, "PUT", "/jobs/"+j.ID+"/start", j.Token, map[string]string{})
	assert.Equal(t, http.StatusUnprocessableEntity, r.status)
	r = call(t, s, "GET", "/jobs/"+j.ID, j.Token, nil)
	assert.JSONEq(t, `{"state":"canceled"}`, string(r.body))
}

func TestFinish(t *testing.T) {
	tests := []struct {
		name       string
		cancel     bool
		body       map[string]any
		wantStatus int
		wantState  string
		wantExit   string
	}{
		{"passing", false, map[string]any{"exit_status": "0", "chunks_failed_count": 0}, 200, StateFinished, "0"},
		{"failing", false, map[string]any{"exit_status": "3", "chunks_failed_count": 2}, 200, StateFinished, "3"},
		{"canceled", true, map[string]any{"exit_status": "-1", "signal": "SIGTERM", "signal_reason": "cancel"}, 200, StateCanceled, "-1"},
		{"exit status as a number", false, map[string]any{"exit_status": 0}, 422, StateRunning, ""},
		{"exit status not an integer", false, map[string]any{"exit_status": "zero"}, 422, StateRunning, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, Options{})
			_, j := startedJob(t, s, oneStep)
			if tt.cancel {
				require.NoError(t, s.CancelJob(j.ID))
				r := call(t, s, "GET", "/jobs/"+j.ID, j.Token, nil)
				require.JSONEq(t, `{"state":"canceling"}`, string(r.body))
			}
			r := call(t, s, "PUT", "/jobs/"+j.ID+"/finish", j.Token, tt.body)
			require.Equal(t, tt.wantStatus, r.status, "body: %s", r.body)
			snap, _ := s.Job(j.ID)
			assert.Equal(t, tt.wantState, snap.State)
			assert.Equal(t, tt.wantExit, snap.ExitStatus)
			assert.Equal(t, 1, snap.FinishCount)
			if tt.wantStatus != 200 {
				assert.Zero(t, snap.FinishesAccepted+snap.FinishesRefused, "a malformed finish is neither accepted nor a second finish")
				return
			}
			assert.Equal(t, 1, snap.FinishesAccepted)
			assert.Zero(t, snap.FinishesRefused)
			assert.Equal(t, tt.body["signal_reason"], nilIfEmpty(snap.SignalReason))
			if n, ok := tt.body["chunks_failed_count"]; ok {
				assert.Equal(t, n, snap.ChunksFailedCount)
			}

			// Finish happens exactly once.
			r = call(t, s, "PUT", "/jobs/"+j.ID+"/finish", j.Token, tt.body)
			assert.Equal(t, http.StatusUnprocessableEntity, r.status)
			snap, _ = s.Job(j.ID)
			assert.Equal(t, 2, snap.FinishCount, "every finish call is counted")
			assert.Equal(t, 1, snap.FinishesAccepted, "the second finish is not accepted")
			assert.Equal(t, 1, snap.FinishesRefused, "the second finish is recorded as refused")
			assert.Equal(t, tt.wantState, snap.State, "a second finish changes nothing")
		})
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func TestFinishWithIgnoreAgentInDispatches(t *testing.T) {
	s := startFake(t, Options{})
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: a\n  - command: b\n"})
	require.NoError(t, err)
	a := registerAgent(t, s, "a", "queue=default")
	j := takeJob(t, s, a)
	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+j.ID+"/start", j.Token, map[string]string{}).status)
	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+j.ID+"/finish", j.Token, map[string]any{"exit_status": "0", "ignore_agent_in_dispatches": true}).status)
	assert.Nil(t, ping(t, s, a).Job, "the agent asked not to get more jobs")
}

func TestTimeout(t *testing.T) {
	s := startFake(t, Options{MinuteDuration: 100 * time.Millisecond})
	_, j := startedJob(t, s, "steps:\n  - command: sleep 100\n    timeout_in_minutes: 2\n")
	assert.Equal(t, "2", j.Env["BUILDKITE_TIMEOUT"])
	snap := waitJob(t, s, j.ID, func(j JobSnapshot) bool { return j.State == StateTimingOut })
	assert.GreaterOrEqual(t, time.Since(snap.StartedAt), 200*time.Millisecond)
	r := call(t, s, "GET", "/jobs/"+j.ID, j.Token, nil)
	assert.JSONEq(t, `{"state":"timing_out"}`, string(r.body))
	r = call(t, s, "PUT", "/jobs/"+j.ID+"/finish", j.Token, map[string]any{"exit_status": "-1", "signal": "SIGTERM", "signal_reason": "cancel"})
	require.Equal(t, 200, r.status)
	snap, _ = s.Job(j.ID)
	assert.Equal(t, StateTimedOut, snap.State)
}

func TestMetaData(t *testing.T) {
	s := startFake(t, Options{})
	_, j := startedJob(t, s, "steps:\n  - command: a\n  - command: b\n")
	buildID := j.Env["BUILDKITE_BUILD_ID"]
	// The second job of the same build sees the same meta-data.
	a2 := registerAgent(t, s, "second", "queue=default")
	j2 := takeJob(t, s, a2)

	steps := []struct {
		name  string
		path  string
		token string
		body  any
		want  int
		resp  string
	}{
		{"get missing", "/jobs/" + j.ID + "/data/get", j.Token, map[string]string{"key": "k"}, 404, ""},
		{"exists missing", "/jobs/" + j.ID + "/data/exists", j.Token, map[string]string{"key": "k"}, 200, `{"exists":false}`},
		{"set blank key", "/jobs/" + j.ID + "/data/set", j.Token, map[string]string{"key": "", "value": "v"}, 422, ""},
		{"set blank value", "/jobs/" + j.ID + "/data/set", j.Token, map[string]string{"key": "k", "value": ""}, 422, ""},
		{"set", "/jobs/" + j.ID + "/data/set", j.Token, map[string]string{"key": "k", "value": "v 1"}, 201, ""},
		{"get", "/jobs/" + j.ID + "/data/get", j.Token, map[string]string{"key": "k"}, 200, `{"key":"k","value":"v 1"}`},
		{"get from another job of the build", "/jobs/" + j2.ID + "/data/get", j2.Token, map[string]string{"key": "k"}, 200, `{"key":"k","value":"v 1"}`},
		{"set-batch with a blank value sets nothing", "/jobs/" + j.ID + "/data/set-batch", j.Token, map[string]any{"items": []map[string]string{{"key": "x", "value": "1"}, {"key": "y", "value": ""}}}, 422, ""},
		{"exists after failed batch", "/jobs/" + j.ID + "/data/exists", j.Token, map[string]string{"key": "x"}, 200, `{"exists":false}`},
		{"set-batch", "/jobs/" + j.ID + "/data/set-batch", j.Token, map[string]any{"items": []map[string]string{{"key": "x", "value": "1"}, {"key": "y", "value": "2"}}}, 201, ""},
		{"keys", "/jobs/" + j.ID + "/data/keys", j.Token, nil, 200, `["k","x","y"]`},
		{"build get", "/builds/" + buildID + "/data/get", j.Token, map[string]string{"key": "y"}, 200, `{"key":"y","value":"2"}`},
		{"build exists", "/builds/" + buildID + "/data/exists", j.Token, map[string]string{"key": "y"}, 200, `{"exists":true}`},
		{"build keys", "/builds/" + buildID + "/data/keys", j.Token, nil, 200, `["k","x","y"]`},
		{"unknown build", "/builds/" + newUUID() + "/data/keys", j.Token, nil, 404, ""},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := call(t, s, "POST", st.path, st.token, st.body)
			require.Equal(t, st.want, r.status, "body: %s", r.body)
			if st.resp != "" {
				assert.JSONEq(t, st.resp, string(r.body))
			}
		})
	}
	b, _ := s.Build(buildID)
	assert.Equal(t, map[string]string{"k": "v 1", "x": "1", "y": "2"}, b.MetaData)
}

func TestAnnotations(t *testing.T) {
	s := startFake(t, Options{})
	_, j := startedJob(t, s, oneStep)
	path := "/jobs/" + j.ID + "/annotations"
	assert.Equal(t, 201, call(t, s, "POST", path, j.Token, map[string]any{"body": "a", "context": "c1", "style": "info"}).status)
	assert.Equal(t, 200, call(t, s, "POST", path, j.Token, map[string]any{"body": "b", "context": "c1", "append": true}).status)
	assert.Equal(t, 201, call(t, s, "POST", path, j.Token, map[string]any{"body": "z"}).status)
	assert.Equal(t, 422, call(t, s, "POST", path, j.Token, map[string]any{"body": "z", "style": "pink"}).status)
	b, _ := s.Build(j.Env["BUILDKITE_BUILD_ID"])
	assert.Equal(t, []Annotation{{Context: "c1", Style: "info", Body: "ab"}, {Context: "default", Style: "default", Body: "z"}}, b.Annotations)
	assert.Equal(t, 200, call(t, s, "DELETE", path+"/c1", j.Token, nil).status)
	assert.Equal(t, 404, call(t, s, "DELETE", path+"/c1", j.Token, nil).status)
	b, _ = s.Build(j.Env["BUILDKITE_BUILD_ID"])
	assert.Equal(t, []Annotation{{Context: "default", Style: "default", Body: "z"}}, b.Annotations, "a removed annotation is gone")
}

// A job-scoped annotation shows on its job, not the build; its context is its own (a build
// annotation of the same context is another annotation), it is removed with its scope, and
// a higher priority comes first.
func TestJobScopedAnnotations(t *testing.T) {
	s := startFake(t, Options{})
	_, j := startedJob(t, s, oneStep)
	path := "/jobs/" + j.ID + "/annotations"
	assert.Equal(t, 201, call(t, s, "POST", path, j.Token, map[string]any{"body": "on the job", "context": "c", "style": "warning", "scope": "job"}).status)
	assert.Equal(t, 201, call(t, s, "POST", path, j.Token, map[string]any{"body": "urgent", "context": "u", "scope": "job", "priority": 10}).status)
	assert.Equal(t, 201, call(t, s, "POST", path, j.Token, map[string]any{"body": "on the build", "context": "c", "scope": "build"}).status)
	assert.Equal(t, 422, call(t, s, "POST", path, j.Token, map[string]any{"body": "x", "scope": "step"}).status)
	assert.Equal(t, 422, call(t, s, "POST", path, j.Token, map[string]any{"body": "x", "priority": 11}).status)

	js, _ := s.Job(j.ID)
	assert.Equal(t, []Annotation{{Context: "u", Style: "default", Body: "urgent"}, {Context: "c", Style: "warning", Body: "on the job"}}, js.Annotations)
	b, _ := s.Build(j.Env["BUILDKITE_BUILD_ID"])
	assert.Equal(t, []Annotation{{Context: "c", Style: "default", Body: "on the build"}}, b.Annotations)
	page := call(t, s, "GET", s.URL()+"/", "", nil)
	assert.Contains(t, string(page.body), "on the job")

	assert.Equal(t, 200, call(t, s, "DELETE", path+"/c?scope=job", j.Token, nil).status)
	assert.Equal(t, 404, call(t, s, "DELETE", path+"/c?scope=job", j.Token, nil).status)
	js, _ = s.Job(j.ID)
	assert.Equal(t, []Annotation{{Context: "u", Style: "default", Body: "urgent"}}, js.Annotations)
	b, _ = s.Build(j.Env["BUILDKITE_BUILD_ID"])
	assert.Len(t, b.Annotations, 1, "the build's annotation of the same context stays")
	page = call(t, s, "GET", s.URL()+"/", "", nil)
	assert.NotContains(t, string(page.body), "on the job", "a removed annotation disappears from the page")
}

func TestPipelineUpload(t *testing.T) {
	s := startFake(t, Options{})
	_, j := startedJob(t, s, oneStep)
	id := newUUID()
	body := map[string]any{"uuid": id, "pipeline": map[string]any{
		"env":   map[string]string{"FROM_PIPELINE": "1"},
		"steps": []any{map[string]any{"command": "echo up", "key": "up", "agents": map[string]string{"queue": "other"}}, "wait"},
	}}
	r := call(t, s, "POST", "/jobs/"+j.ID+"/pipelines?async=true", j.Token, body)
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
	loc := r.header.Get("Location")
	assert.Equal(t, s.Endpoint()+"/jobs/"+j.ID+"/pipelines/"+id, loc)
	assert.NotEmpty(t, r.header.Get("Retry-After"))

	r = call(t, s, "GET", loc, j.Token, nil)
	require.Equal(t, 200, r.status)
	assert.JSONEq(t, `{"state":"applied","message":""}`, string(r.body))

	// The same upload again (a retry) adds nothing.
	r = call(t, s, "POST", "/jobs/"+j.ID+"/pipelines?async=true", j.Token, body)
	require.Equal(t, http.StatusAccepted, r.status)

	b, _ := s.Build(j.Env["BUILDKITE_BUILD_ID"])
	require.Len(t, b.Jobs, 2)
	up, _ := s.Job(b.Jobs[1])
	assert.Equal(t, "up", up.StepKey)
	assert.Equal(t, StateScheduled, up.State)
	assert.Equal(t, j.ID, up.UploadedFromJob)
	assert.Equal(t, []string{"queue=other"}, up.AgentQueryRules)
	assert.Equal(t, "1", up.Env["FROM_PIPELINE"])
	assert.Equal(t, j.Env["BUILDKITE_BUILD_ID"], up.Env["BUILDKITE_BUILD_ID"])

	r = call(t, s, "GET", "/jobs/"+j.ID+"/pipelines/"+newUUID(), j.Token, nil)
	assert.Equal(t, 404, r.status)
	r = call(t, s, "POST", "/jobs/"+j.ID+"/pipelines?async=true", j.Token, map[string]any{"uuid": newUUID(), "pipeline": map[string]any{"steps": []any{map[string]any{"bogus": 1}}}})
	assert.Equal(t, 422, r.status, "an invalid pipeline is rejected: %s", r.body)
}

func TestHeartbeat(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "hb", "queue=default")
	r := call(t, s, "POST", "/heartbeat", a.token, map[string]string{"sent_at": "2026-01-01T00:00:00Z"})
	require.Equal(t, 200, r.status)
	var hb struct {
		SentAt     string `json:"sent_at"`
		ReceivedAt string `json:"received_at"`
	}
	r.json(t, &hb)
	assert.Equal(t, "2026-01-01T00:00:00Z", hb.SentAt)
	_, err := time.Parse(time.RFC3339Nano, hb.ReceivedAt)
	assert.NoError(t, err)
	snap, _ := s.Agent(a.id)
	assert.False(t, snap.LastHeartbeat.IsZero())
}

func TestAgentLifecycleStates(t *testing.T) {
	s := startFake(t, Options{HeartbeatInterval: 1, AgentLostAfter: 300 * time.Millisecond})
	r := call(t, s, "POST", "/register", s.RegistrationToken(), map[string]any{"name": "life", "meta_data": []string{"queue=default"}})
	var reg struct {
		ID, AccessToken   string `json:"-"`
		PingInterval      int    `json:"ping_interval"`
		HeartbeatInterval int    `json:"heartbeat_interval"`
		JobStatusInterval int    `json:"job_status_interval"`
	}
	r.json(t, &reg)
	assert.Equal(t, 1, reg.PingInterval)
	assert.Equal(t, 1, reg.HeartbeatInterval)
	assert.Equal(t, 1, reg.JobStatusInterval)
	a := s.Agents()[0]
	assert.Equal(t, AgentRegistered, a.State)

	a2 := registerAgent(t, s, "life2", "queue=default")
	snap, _ := s.Agent(a2.id)
	assert.Equal(t, AgentConnected, snap.State)
	assert.True(t, snap.Connected)
	time.Sleep(400 * time.Millisecond)
	snap, _ = s.Agent(a2.id)
	assert.Equal(t, AgentLost, snap.State, "silent for longer than AgentLostAfter")
	ping(t, s, a2)
	snap, _ = s.Agent(a2.id)
	assert.Equal(t, AgentConnected, snap.State)
	require.Equal(t, 200, call(t, s, "POST", "/stop", a2.token, map[string]bool{"force": false}).status)
	snap, _ = s.Agent(a2.id)
	assert.Equal(t, AgentStopped, snap.State)
	require.Equal(t, 200, call(t, s, "POST", "/disconnect", a2.token, nil).status)
	snap, _ = s.Agent(a2.id)
	assert.Equal(t, AgentDisconnected, snap.State)
}

func TestPingActions(t *testing.T) {
	s := startFake(t, Options{})
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
	require.NoError(t, err)
	a := registerAgent(t, s, "p", "queue=default")
	require.NoError(t, s.SetAgentAction(a.id, ActionPause))
	p := ping(t, s, a)
	assert.Equal(t, ActionPause, p.Action)
	assert.Nil(t, p.Job, "a paused agent gets no job")
	require.NoError(t, s.SetAgentAction(a.id, ActionDisconnect))
	assert.Equal(t, ActionDisconnect, ping(t, s, a).Action)
	require.NoError(t, s.SetAgentAction(a.id, ActionIdle))
	p = ping(t, s, a)
	assert.Equal(t, ActionIdle, p.Action)
	assert.NotNil(t, p.Job)
	assert.Error(t, s.SetAgentAction(a.id, "dance"))
}

func TestUnstartedServesThroughItsHandler(t *testing.T) {
	s := NewUnstarted(Options{RegistrationToken: "tok"})
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	s.SetBaseURL(hs.URL + "/")
	assert.Equal(t, hs.URL+"/v3", s.Endpoint())
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
	require.NoError(t, err)
	assert.Equal(t, hs.URL+"/org/pipeline/builds/1", b.URL)
	a := registerAgent(t, s, "h", "queue=default")
	assert.Equal(t, b.Jobs[0], takeJob(t, s, a).ID)
	require.NoError(t, s.Close())
}
