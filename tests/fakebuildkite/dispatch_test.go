package fakebuildkite

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRulesMatch(t *testing.T) {
	tests := []struct {
		name  string
		rules []string
		tags  []string
		want  bool
	}{
		{"exact", []string{"queue=bk-operator"}, []string{"queue=bk-operator"}, true},
		{"all rules must hold", []string{"queue=bk-operator", "cluster=gke-prod"}, []string{"queue=bk-operator"}, false},
		{"extra agent tags are fine", []string{"queue=bk-operator", "cluster=gke-prod"}, []string{"cluster=gke-prod", "queue=bk-operator", "x=y"}, true},
		{"wrong value", []string{"queue=a"}, []string{"queue=b"}, false},
		{"wildcard", []string{"queue=a", "os=*"}, []string{"queue=a", "os=linux"}, true},
		{"wildcard needs the key", []string{"queue=a", "os=*"}, []string{"queue=a"}, false},
		{"no tags", []string{"queue=default"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, rulesMatch(tt.rules, tt.tags))
		})
	}
}

func TestDispatchByTags(t *testing.T) {
	tests := []struct {
		name      string
		agents    string // the step's agents, YAML
		tags      []string
		wantOffer bool
	}{
		{"no agents means queue=default", "", []string{"queue=default"}, true},
		{"no agents, other queue", "", []string{"queue=bk-operator"}, false},
		{"map", "{queue: bk-operator, cluster: gke-prod}", []string{"queue=bk-operator", "cluster=gke-prod"}, true},
		{"map, missing tag", "{queue: bk-operator, cluster: gke-prod}", []string{"queue=bk-operator"}, false},
		{"list", "[\"queue=bk-operator\", \"cluster=gke-prod\"]", []string{"queue=bk-operator", "cluster=gke-prod"}, true},
		{"wildcard", "{queue: bk-operator, cluster: \"*\"}", []string{"queue=bk-operator", "cluster=anything"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, Options{})
			yaml := "steps:\n  - command: x\n"
			if tt.agents != "" {
				yaml += "    agents: " + tt.agents + "\n"
			}
			b, err := s.CreateBuild(BuildRequest{PipelineYAML: yaml})
			require.NoError(t, err)
			a := registerAgent(t, s, "a", tt.tags...)
			p := ping(t, s, a)
			if !tt.wantOffer {
				assert.Nil(t, p.Job)
				return
			}
			require.NotNil(t, p.Job)
			assert.Equal(t, b.Jobs[0], p.Job.ID)
			snap, _ := s.Job(b.Jobs[0])
			assert.Equal(t, StateAssigned, snap.State)
			assert.Equal(t, a.id, snap.AssignedTo)
		})
	}
}

func TestDispatchOneJobPerAgent(t *testing.T) {
	s := startFake(t, Options{})
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: a\n  - command: b\n  - command: c\n"})
	require.NoError(t, err)
	a := registerAgent(t, s, "a", "queue=default")
	j := takeJob(t, s, a)
	assert.Equal(t, b.Jobs[0], j.ID, "jobs are dispatched oldest first")
	assert.Nil(t, ping(t, s, a).Job, "an agent with a job gets no other")

	other := registerAgent(t, s, "other", "queue=default")
	assert.Equal(t, b.Jobs[1], takeJob(t, s, other).ID)

	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+j.ID+"/start", j.Token, map[string]string{}).status)
	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+j.ID+"/finish", j.Token, map[string]string{"exit_status": "0"}).status)
	assert.Equal(t, b.Jobs[2], takeJob(t, s, a).ID, "after finish the agent gets the next job")
}

func TestDispatchSkipsIgnoredAndUnconnectedAgents(t *testing.T) {
	s := startFake(t, Options{})
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
	require.NoError(t, err)

	r := call(t, s, "POST", "/register", s.RegistrationToken(), map[string]any{"name": "acq", "meta_data": []string{"queue=default"}, "ignore_in_dispatches": true})
	var reg struct {
		AccessToken string `json:"access_token"`
	}
	r.json(t, &reg)
	require.Equal(t, 200, call(t, s, "POST", "/connect", reg.AccessToken, nil).status)
	p := call(t, s, "GET", "/ping", reg.AccessToken, nil)
	assert.JSONEq(t, `{"action":"idle"}`, string(p.body))

	r = call(t, s, "POST", "/register", s.RegistrationToken(), map[string]any{"name": "unconnected", "meta_data": []string{"queue=default"}})
	r.json(t, &reg)
	p = call(t, s, "GET", "/ping", reg.AccessToken, nil)
	assert.JSONEq(t, `{"action":"idle"}`, string(p.body), "an agent that did not connect gets no job")
}

func TestAcquire(t *testing.T) {
	s := startFake(t, Options{})
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
	require.NoError(t, err)
	r := call(t, s, "POST", "/register", s.RegistrationToken(), map[string]any{"name": "acq", "meta_data": []string{"queue=default"}, "ignore_in_dispatches": true})
	var reg struct {
		AccessToken string `json:"access_token"`
	}
	r.json(t, &reg)
	r = call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/acquire", reg.AccessToken, nil)
	require.Equal(t, 200, r.status, "%s", r.body)
	var j acceptedJob
	r.json(t, &j)
	assert.Equal(t, StateAccepted, j.State)
	assert.NotEmpty(t, j.Token)
	r = call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/acquire", reg.AccessToken, nil)
	assert.Equal(t, 200, r.status, "acquire is idempotent for the same agent")
}

// TestUnacceptedOfferIsTakenBack: an agent whose accept failed pings again; the job goes back to
// the queue and can be offered again.
func TestUnacceptedOfferIsTakenBack(t *testing.T) {
	s := startFake(t, Options{})
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep})
	require.NoError(t, err)
	a := registerAgent(t, s, "a", "queue=default")
	s.Inject(Fault{Endpoint: EPAccept, Status: 422, Message: "Job has already been accepted by another agent", Times: 1})
	p := ping(t, s, a)
	require.NotNil(t, p.Job)
	r := call(t, s, "PUT", "/jobs/"+p.Job.ID+"/accept", a.token, nil)
	assert.Equal(t, 422, r.status)
	assert.Equal(t, "Job has already been accepted by another agent", r.message(t))
	j := takeJob(t, s, a)
	assert.Equal(t, b.Jobs[0], j.ID)
}

func TestFaults(t *testing.T) {
	t.Run("status with Retry-After, limited times", func(t *testing.T) {
		s := startFake(t, Options{})
		a := registerAgent(t, s, "a", "queue=default")
		s.Inject(Fault{Endpoint: EPPing, Status: 429, RetryAfter: 1500 * time.Millisecond, Times: 2})
		for range 2 {
			r := call(t, s, "GET", "/ping", a.token, nil)
			assert.Equal(t, 429, r.status)
			assert.Equal(t, "2", r.header.Get("Retry-After"))
		}
		assert.Equal(t, 200, call(t, s, "GET", "/ping", a.token, nil).status)
		reqs := s.Requests()
		assert.True(t, reqs[len(reqs)-2].Faulted)
		assert.False(t, reqs[len(reqs)-1].Faulted)
	})
	t.Run("until cleared, filtered by agent", func(t *testing.T) {
		s := startFake(t, Options{})
		a := registerAgent(t, s, "a", "queue=default")
		b := registerAgent(t, s, "b", "queue=default")
		s.Inject(Fault{Endpoint: "*", Status: 503, AgentID: a.id})
		for range 3 {
			assert.Equal(t, 503, call(t, s, "GET", "/ping", a.token, nil).status)
		}
		assert.Equal(t, 200, call(t, s, "GET", "/ping", b.token, nil).status)
		s.ClearFaults()
		assert.Equal(t, 200, call(t, s, "GET", "/ping", a.token, nil).status)
	})
	t.Run("filtered by job", func(t *testing.T) {
		s := startFake(t, Options{})
		_, j := startedJob(t, s, oneStep)
		_, j2 := startedJob(t, s, oneStep)
		s.Inject(Fault{Endpoint: EPJobState, Status: 500, JobID: j.ID})
		assert.Equal(t, 500, call(t, s, "GET", "/jobs/"+j.ID, j.Token, nil).status)
		assert.Equal(t, 200, call(t, s, "GET", "/jobs/"+j2.ID, j2.Token, nil).status)
	})
	t.Run("latency", func(t *testing.T) {
		s := startFake(t, Options{})
		a := registerAgent(t, s, "a", "queue=default")
		s.Inject(Fault{Endpoint: EPHeartbeat, Latency: 300 * time.Millisecond, Times: 1})
		start := time.Now()
		assert.Equal(t, 200, call(t, s, "POST", "/heartbeat", a.token, map[string]string{"sent_at": "x"}).status)
		assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	})
	t.Run("dropped connection", func(t *testing.T) {
		s := startFake(t, Options{})
		a := registerAgent(t, s, "a", "queue=default")
		s.Inject(Fault{Endpoint: EPPing, DropConnection: true, Times: 1})
		req, err := http.NewRequest("GET", s.Endpoint()+"/ping", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Token "+a.token)
		_, err = (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		assert.Error(t, err, "the connection is closed without a response")
		assert.Equal(t, 200, call(t, s, "GET", "/ping", a.token, nil).status)
	})
}

func TestControlAPI(t *testing.T) {
	s := startFake(t, Options{})
	body := map[string]any{"pipeline": "demo", "org": "acme", "pipeline_yaml": "steps:\n  - command: echo '<b>hi</b>'\n    label: \"<script>x</script>\"\n", "repo": "/tmp/r"}
	r := call(t, s, "POST", s.URL()+"/control/builds", "", body)
	require.Equal(t, 201, r.status, "%s", r.body)
	var b Build
	r.json(t, &b)
	assert.Equal(t, 1, b.Number)
	assert.Equal(t, s.URL()+"/acme/demo/builds/1", b.URL)
	require.Len(t, b.Jobs, 1)

	r = call(t, s, "POST", s.URL()+"/control/builds", "", map[string]any{"pipeline_yaml": "steps: [{wait: ~}]"})
	assert.Equal(t, 422, r.status, "a pipeline without command steps is refused: %s", r.body)

	_, j := startedJob(t, s, oneStep)
	require.Equal(t, 201, postChunk(t, s, j.ID, j.Token, 1, 0, []byte("\x1b_bk;t=1\x07\x1b[31mred <tag>\x1b[0m\n")).status)

	var jv JobView
	r = call(t, s, "GET", s.URL()+"/control/jobs/"+j.ID, "", nil)
	require.Equal(t, 200, r.status)
	r.json(t, &jv)
	assert.Equal(t, StateRunning, jv.State)
	assert.Equal(t, "red <tag>\n", jv.PlainLog)

	r = call(t, s, "POST", s.URL()+"/control/jobs/"+j.ID+"/cancel", "", nil)
	require.Equal(t, 200, r.status)
	r.json(t, &jv)
	assert.Equal(t, StateCanceling, jv.State)

	r = call(t, s, "GET", s.URL()+"/control/jobs", "", nil)
	var jobs []JobView
	r.json(t, &jobs)
	assert.Len(t, jobs, 2)

	r = call(t, s, "GET", s.URL()+"/control/agents", "", nil)
	var agents []AgentSnapshot
	r.json(t, &agents)
	require.Len(t, agents, 1)
	assert.Equal(t, []string{"queue=default"}, agents[0].Tags)

	r = call(t, s, "POST", s.URL()+"/control/faults", "", map[string]any{"endpoint": "ping", "status": 503, "times": 1})
	require.Equal(t, 201, r.status)
	r = call(t, s, "POST", s.URL()+fmt.Sprintf("/control/agents/%s/action", agents[0].ID), "", map[string]string{"action": "pause"})
	require.Equal(t, 200, r.status)

	r = call(t, s, "GET", s.URL()+"/", "", nil)
	require.Equal(t, 200, r.status)
	page := string(r.body)
	assert.Contains(t, page, "red &lt;tag&gt;")
	assert.Contains(t, page, "&lt;script&gt;x&lt;/script&gt;")
	assert.NotContains(t, page, "<script>x")
	assert.NotContains(t, page, "\x1b")
	r = call(t, s, "GET", b.URL, "", nil)
	assert.Equal(t, 200, r.status)
	assert.Contains(t, string(r.body), "acme/demo #1")
	r = call(t, s, "GET", s.URL()+"/v3/nothing", "", nil)
	assert.Equal(t, 404, r.status)
	assert.True(t, json.Valid(r.body))
}
