package supervisor

import (
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

func TestWarmJobEnv(t *testing.T) {
	handoffVars := []string{
		podcontract.EnvHandoffURL + "=https://agentd.example:8443/handoff",
		podcontract.EnvHandoffTokenPath + "=/var/run/handoff/token",
		podcontract.EnvHandoffCAPath + "=/var/run/handoff/ca.crt",
	}
	own := append([]string{"PATH=/usr/bin:/bin", "SHARED=pod", "POD_ONLY=kept"}, handoffVars...)
	cases := []struct {
		name    string
		own     []string
		job     handoffclient.Job
		want    []string
		wantErr string
	}{
		{
			name: "the job's env over the pod's, its ID and token added, the hand-off left out",
			own:  own,
			job: handoffclient.Job{ID: "job-1", Token: "job-token", Env: map[string]string{
				"SHARED": "job", "JOB_ONLY": "x=y", podcontract.EnvJobID: "job-1",
			}},
			want: []string{
				"PATH=/usr/bin:/bin", "POD_ONLY=kept",
				podcontract.EnvAccessToken + "=job-token", podcontract.EnvJobID + "=job-1", "JOB_ONLY=x=y", "SHARED=job",
			},
		},
		{
			name: "an empty job env: the pod's, the job's ID, command and token",
			own:  own,
			job:  handoffclient.Job{ID: "job-2", Command: "make test", Token: "job-token"},
			want: []string{
				"PATH=/usr/bin:/bin", "SHARED=pod", "POD_ONLY=kept",
				podcontract.EnvAccessToken + "=job-token", podcontract.EnvCommand + "=make test", podcontract.EnvJobID + "=job-2",
			},
		},
		{
			name: "the job token replaces any the pod or the job's env has",
			own:  []string{podcontract.EnvAccessToken + "=pod-token", "A=1"},
			job:  handoffclient.Job{ID: "j", Token: "job-token", Env: map[string]string{podcontract.EnvAccessToken: "env-token"}},
			want: []string{"A=1", podcontract.EnvAccessToken + "=job-token", podcontract.EnvJobID + "=j"},
		},
		{
			name: "the later of the pod's own duplicates stays last, so it still wins",
			own:  []string{"DUP=first", "DUP=second"},
			job:  handoffclient.Job{ID: "j", Token: "t"},
			want: []string{"DUP=first", "DUP=second", podcontract.EnvAccessToken + "=t", podcontract.EnvJobID + "=j"},
		},
		{
			name: "hand-off settings in the job's env do not reach the job either",
			own:  own[:1],
			job: handoffclient.Job{ID: "j", Token: "t", Env: map[string]string{
				podcontract.EnvHandoffURL: "https://elsewhere", podcontract.EnvHandoffTokenPath: "/x", podcontract.EnvHandoffCAPath: "/y",
			}},
			want: []string{"PATH=/usr/bin:/bin", podcontract.EnvAccessToken + "=t", podcontract.EnvJobID + "=j"},
		},
		{
			name: "a pod entry without '=' is passed on as it is",
			own:  []string{"ODD", "A=1"},
			job:  handoffclient.Job{ID: "j", Token: "t", Env: map[string]string{"B": "2"}},
			want: []string{"ODD", "A=1", "B=2", podcontract.EnvAccessToken + "=t", podcontract.EnvJobID + "=j"},
		},
		{
			name:    "a job env name holding '=' is refused, its value not printed",
			own:     own,
			job:     handoffclient.Job{ID: "j", Token: "t", Env: map[string]string{"NAME=secret-part": "v"}},
			wantErr: `"NAME"… (a name holding '=')`,
		},
		{
			name:    "a job env entry with no name is refused",
			own:     own,
			job:     handoffclient.Job{ID: "j", Token: "t", Env: map[string]string{"": "v"}},
			wantErr: "a variable with no name",
		},
		{
			name:    "a NUL in a value is refused",
			own:     own,
			job:     handoffclient.Job{ID: "j", Token: "t", Env: map[string]string{"BAD": "a\x00b"}},
			wantErr: "BAD (a value holding NUL)",
		},
		{
			name:    "a job ID the job's env contradicts",
			own:     own,
			job:     handoffclient.Job{ID: "j", Token: "t", Env: map[string]string{podcontract.EnvJobID: "other"}},
			wantErr: "inconsistent: its job's " + podcontract.EnvJobID,
		},
		{
			name:    "no job ID",
			own:     own,
			job:     handoffclient.Job{Token: "t"},
			wantErr: "no job ID",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := warmJobEnv(tc.own, tc.job)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.NotContains(t, err.Error(), "secret-part")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// handoffStandIn is a stand-in for agentd's hand-off endpoint (pkg/handoff's handler): it
// checks the bearer token against the pod's token file, and serve answers the rest.
type handoffStandIn struct {
	url, tokenPath, caPath string
	requests               atomic.Int32
}

func startHandoffStandIn(t *testing.T, serve http.HandlerFunc) *handoffStandIn {
	t.Helper()
	dir := t.TempDir()
	h := &handoffStandIn{tokenPath: filepath.Join(dir, "token"), caPath: filepath.Join(dir, "ca.crt")}
	token := "projected-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	require.NoError(t, os.WriteFile(h.tokenPath, []byte(token+"\n"), 0o600))
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(handoffclient.ErrorResponse{Reason: handoffclient.ReasonUnauthenticated, Message: "wrong token or method"})
			return
		}
		h.requests.Add(1)
		serve(w, r)
	}))
	t.Cleanup(srv.Close)
	require.NoError(t, os.WriteFile(h.caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	h.url = srv.URL + "/handoff"
	return h
}

// env is the hand-off's settings, as the controller gives them to a warm pod.
func (h *handoffStandIn) env() []string {
	return []string{
		podcontract.EnvHandoffURL + "=" + h.url,
		podcontract.EnvHandoffTokenPath + "=" + h.tokenPath,
		podcontract.EnvHandoffCAPath + "=" + h.caPath,
	}
}

// startWarm runs the supervisor as a warm pod's: its environment has the harness's
// settings, the hand-off's and extra, and none of the job's, which comes from the hand-off.
func (h *harness) startWarm(handoff *handoffStandIn, extra ...string) *supervisor {
	h.t.Helper()
	env := []string{helperEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + h.dir, podcontract.EnvProgressPath + "=" + h.progress}
	for k, v := range h.env {
		env = append(env, k+"="+v)
	}
	env = append(append(env, handoff.env()...), extra...)
	cmd := exec.Command(os.Args[0], "--workspace", h.ws, "--"+podcontract.FinishFlushedFlag)
	cmd.Env = env
	sv := &supervisor{cmd: cmd, stderr: &testkit.SyncBuffer{}, stdout: &testkit.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = io.MultiWriter(sv.stdout, sv.stderr)
	cmd.Stderr = sv.stderr
	require.NoError(h.t, cmd.Start())
	go func() {
		sv.err = cmd.Wait()
		close(sv.done)
	}()
	h.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-sv.done
		assert.NotContains(h.t, sv.stderr.String(), h.job.Token, "the supervisor printed the job token")
	})
	return sv
}

// TestWarmPodRunsItsHandedOffJob: a warm pod's supervisor gets its job from the hand-off
// and runs it as a job pod's would: the command sees the job's env over the pod's, and
// none of the hand-off's settings; its output reaches Buildkite, which the supervisor
// finishes with the command's exit status.
func TestWarmPodRunsItsHandedOffJob(t *testing.T) {
	command := `echo "overlay=$WARM_OVERLAY pod=$WARM_POD_ONLY job=$BUILDKITE_JOB_ID"; ` +
		`echo "handoff=${BK_OPERATOR_HANDOFF_URL-unset},${BK_OPERATOR_HANDOFF_TOKEN_PATH-unset},${BK_OPERATOR_HANDOFF_CA_PATH-unset}"; ` +
		`echo "tokenlen=${#BUILDKITE_AGENT_ACCESS_TOKEN}"; echo "envfile=$BUILDKITE_ENV_FILE"; exit 3`
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
	tmp := t.TempDir()
	jobEnv := map[string]string{
		podcontract.EnvEndpoint:  h.s.Endpoint(),
		podcontract.EnvPodMarker: "true",
		"WARM_OVERLAY":           "job",
		// The supervisor's own process takes the job's env too: it writes the env files to
		// the job's TMPDIR, as a job pod's supervisor does.
		"TMPDIR": tmp,
	}
	for k, v := range h.job.Env {
		jobEnv[k] = v
	}
	var served atomic.Int32
	handoff := startHandoffStandIn(t, func(w http.ResponseWriter, _ *http.Request) {
		if served.Add(1) == 1 {
			// Not assigned yet at first, as a warm pod usually finds it.
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(handoffclient.Job{ID: h.job.ID, BuildJob: "warm-test", Env: jobEnv, Token: h.job.Token})
	})
	sv := h.startWarm(handoff, "WARM_OVERLAY=pod", "WARM_POD_ONLY=kept")
	assert.Equal(t, 3, sv.wait(t, 30*time.Second))

	snap := h.snapshot()
	log := fakebuildkite.PlainLog(snap.Log)
	assert.Contains(t, log, "overlay=job pod=kept job="+h.job.ID+"\n")
	assert.Contains(t, log, "handoff=unset,unset,unset\n", "the job saw the hand-off's settings")
	assert.Contains(t, log, "tokenlen="+strconv.Itoa(len(h.job.Token))+"\n")
	assert.Contains(t, log, "envfile="+tmp+"/")
	assert.Equal(t, 1, snap.StartCount)
	assert.Equal(t, 1, snap.FinishCount)
	assert.Equal(t, "3", snap.ExitStatus)
	assert.Equal(t, int32(2), handoff.requests.Load())
	assert.Contains(t, sv.stderr.String(), "job "+h.job.ID+" (BuildJob warm-test) handed off")

	p := h.readProgress()
	assert.True(t, p.Started && p.Exited && p.Flushed && p.Finished, "progress %+v", p)
	assert.Equal(t, 3, p.ExitStatus)
	assert.Empty(t, p.Error)
}

// coldCapable is what would let a supervisor run the harness's job without a hand-off: a
// warm pod never has it, but given it, a supervisor that fell through to the cold path
// would reach Buildkite, which the tests below would see.
func (h *harness) coldCapable() []string {
	env := []string{
		podcontract.EnvEndpoint + "=" + h.s.Endpoint(),
		podcontract.EnvAccessToken + "=" + h.job.Token,
	}
	for k, v := range h.job.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// TestWarmPodDeletedWhileWaiting: a warm pod deleted before it had a job ends at once and
// cleanly: exit 0, a line saying so, no progress record (no job failed), nothing sent to
// Buildkite.
func TestWarmPodDeletedWhileWaiting(t *testing.T) {
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("echo should not run")})
	release := make(chan struct{})
	handoff := startHandoffStandIn(t, func(w http.ResponseWriter, r *http.Request) {
		// The long poll: no job comes.
		select {
		case <-r.Context().Done():
		case <-release:
		}
		w.WriteHeader(http.StatusNoContent)
	})
	t.Cleanup(func() { close(release) })
	before := len(h.s.Requests())
	sv := h.startWarm(handoff, h.coldCapable()...)
	require.Eventually(t, func() bool { return handoff.requests.Load() > 0 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, sv.cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 0, sv.wait(t, 10*time.Second))

	assert.Contains(t, sv.stderr.String(), "stopped while waiting for a job")
	assert.Len(t, h.s.Requests(), before, "the supervisor called Buildkite")
	assert.Zero(t, h.snapshot().StartCount)
	_, err := os.Stat(h.progress)
	assert.ErrorIs(t, err, os.ErrNotExist, "a warm pod with no job recorded progress")
}

// TestWarmPodRefused: a refusal ends the warm pod at once, with the endpoint's reason on
// stderr and in the progress record, marked as a hand-off failure for the controller, and
// nothing sent to Buildkite.
func TestWarmPodRefused(t *testing.T) {
	cases := []struct {
		name   string
		status int
		reason string
	}{
		{"already handed off", http.StatusConflict, handoffclient.ReasonAlreadyHandedOff},
		{"unknown pod", http.StatusForbidden, handoffclient.ReasonUnknownPod},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("echo should not run")})
			handoff := startHandoffStandIn(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				_ = json.NewEncoder(w).Encode(handoffclient.ErrorResponse{Reason: tc.reason, Message: "refused by the stand-in"})
			})
			before := len(h.s.Requests())
			sv := h.startWarm(handoff, h.coldCapable()...)
			assert.Equal(t, 1, sv.wait(t, 20*time.Second))

			want := "HTTP " + strconv.Itoa(tc.status) + " " + tc.reason + "): refused by the stand-in"
			assert.Contains(t, sv.stderr.String(), podcontract.HandoffFailedPrefix)
			assert.Contains(t, sv.stderr.String(), want)
			assert.Equal(t, int32(1), handoff.requests.Load(), "a refusal is not retried")
			assert.Len(t, h.s.Requests(), before, "the supervisor called Buildkite")

			p := h.readProgress()
			assert.True(t, strings.HasPrefix(p.Error, podcontract.HandoffFailedPrefix), "progress error %q", p.Error)
			assert.Contains(t, p.Error, want)
			assert.Equal(t, jobprogress.Progress{Error: p.Error}, p, "only the error is recorded")
		})
	}
}
