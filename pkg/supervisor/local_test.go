package supervisor

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// newLocalHarness is a job run as the pod of a BuildJob made by hand runs it: no token, no
// endpoint, podcontract.EnvLocal. The fake Buildkite holds a job only so that the job's
// env is a real one, and so that the test can see that nothing reached it: requests counts
// what it had received before the supervisor started.
func newLocalHarness(t *testing.T, req fakebuildkite.BuildRequest) (h *harness, requests int) {
	t.Helper()
	h = newHarness(t, fakebuildkite.Options{}, req)
	h.local = true
	return h, len(h.s.Requests())
}

// assertNothingReachedBuildkite checks that the fake received no request since the
// harness was made, and that the job is as the harness left it: accepted, never started.
func assertNothingReachedBuildkite(t *testing.T, h *harness, before int) {
	t.Helper()
	assert.Equal(t, before, len(h.s.Requests()), "a local job sent requests to Buildkite: %+v", h.s.Requests()[min(before, len(h.s.Requests())):])
	snap := h.snapshot()
	assert.Zero(t, snap.StartCount)
	assert.Zero(t, snap.FinishCount)
	assert.Empty(t, snap.Log)
}

// assertLocalProgress checks the progress record of a local job that ran its command to
// its end: how it ended, and nothing of Buildkite (not started, no log acknowledged, not
// finished).
func assertLocalProgress(t *testing.T, p jobprogress.Progress, status int, signal, reason string) {
	t.Helper()
	assert.True(t, p.Exited, "exited")
	assert.True(t, p.Flushed, "all output written")
	assert.Equal(t, status, p.ExitStatus)
	assert.Equal(t, signal, p.Signal)
	assert.Equal(t, reason, p.SignalReason)
	assert.False(t, p.Started, "nothing was started on Buildkite")
	assert.False(t, p.Finished, "nothing was finished on Buildkite")
	assert.Zero(t, p.Sequence, "no log chunk went to Buildkite")
	assert.Zero(t, p.Offset)
	assert.Empty(t, p.Error)
	assert.False(t, p.EndedOnBuildkite)
}

// TestMadeByHandRunsWithoutBuildkite: the pod of a BuildJob made by hand has no job token;
// its supervisor runs the command as for any job, with its output on stdout (kubectl
// logs), redacted, first saying why it is not on Buildkite, and records how it ended,
// without a single request to Buildkite.
func TestMadeByHandRunsWithoutBuildkite(t *testing.T) {
	tests := []struct {
		name     string
		command  string
		env      map[string]string
		wantCode int
		want     []string
		unwanted []string
	}{
		{
			name:     "the output and the exit status",
			command:  "echo hello from a hand-made job; echo to stderr >&2; exit 3",
			wantCode: 3,
			want:     []string{"$ echo hello from a hand-made job", "hello from a hand-made job\n", "to stderr\n"},
		},
		{
			name:     "secrets are redacted",
			command:  `echo "db=$DB_PASSWORD key=$STRIPE_API_KEY plain=$PLAIN"`,
			env:      map[string]string{"DB_PASSWORD": dbPassword, "STRIPE_API_KEY": apiKey, "PLAIN": notSecret},
			want:     []string{"db=[REDACTED] key=[REDACTED] plain=" + notSecret},
			unwanted: []string{dbPassword, apiKey},
		},
		{
			name: "a token and an endpoint the environment gives are not the job's",
			command: `echo "token=${BUILDKITE_AGENT_ACCESS_TOKEN:-none} endpoint=${BUILDKITE_AGENT_ENDPOINT:-none}"; ` +
				`env | grep -c '^BUILDKITE_AGENT_ACCESS_TOKEN=' || true`,
			// Set below to the fake's, as if an envFrom of the environment had them.
			env: map[string]string{podcontract.EnvAccessToken: "", podcontract.EnvEndpoint: ""},
			want: []string{
				"token=none endpoint=none\n0\n",
				"# The job does not get " + podcontract.EnvAccessToken + " and " + podcontract.EnvEndpoint,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, before := newLocalHarness(t, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tt.command)})
			for k, v := range tt.env {
				switch k {
				case podcontract.EnvAccessToken:
					v = h.job.Token
				case podcontract.EnvEndpoint:
					v = h.s.Endpoint()
				}
				h.env[k] = v
			}
			// As in a pod: the controller leaves a local job to be finished by nobody.
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			assert.Equal(t, tt.wantCode, sv.wait(t, 30*time.Second), "the supervisor exits with the command's exit code")

			stdout := sv.stdout.String()
			first, _, _ := strings.Cut(stdout, "\n")
			assert.Equal(t, localNotice, first, "the first line of output says the job runs without Buildkite")
			assert.Contains(t, stdout, localAgentNotice)
			for _, want := range tt.want {
				assert.Contains(t, stdout, want)
			}
			for _, unwanted := range tt.unwanted {
				assert.NotContains(t, sv.stderr.String(), unwanted)
			}
			assert.NotContains(t, stdout, "\x1b_bk;t=", "Buildkite's timestamps stay off stdout")
			assertLocalProgress(t, h.readProgress(), tt.wantCode, "", "")
			assertNothingReachedBuildkite(t, h, before)
		})
	}
}

// TestMadeByHandStopsOnSIGTERM: deleting the pod of a BuildJob made by hand stops its
// command as for any job: SIGTERM, the grace period, SIGKILL, the reason agent_stop.
func TestMadeByHandStopsOnSIGTERM(t *testing.T) {
	tests := []struct {
		name       string
		command    string
		wantCode   int
		wantStatus int
		wantSignal string
		want       string
	}{
		{
			name:       "the command traps SIGTERM and exits",
			command:    `trap 'echo trapped TERM; exit 4' TERM; echo ready; sleep 60 & wait`,
			wantCode:   4,
			wantStatus: 4,
			want:       "trapped TERM\n",
		},
		{
			name:       "SIGKILL after the grace period for a command that ignores SIGTERM",
			command:    `trap 'echo ignoring TERM' TERM; echo ready; while true; do sleep 0.1 || true; done`,
			wantCode:   128 + int(syscall.SIGKILL),
			wantStatus: -1,
			wantSignal: "SIGKILL",
			want:       "ignoring TERM\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, before := newLocalHarness(t, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tt.command)})
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			require.Eventually(t, func() bool { return strings.Contains(sv.stdout.String(), "ready\n") }, 20*time.Second, 50*time.Millisecond,
				"the command did not start; output:\n%s", sv.stderr.String())
			signaled := time.Now()
			require.NoError(t, sv.cmd.Process.Signal(syscall.SIGTERM))
			assert.Equal(t, tt.wantCode, sv.wait(t, 20*time.Second))
			if tt.wantSignal == "SIGKILL" {
				assert.GreaterOrEqual(t, time.Since(signaled), time.Second, "SIGKILL came before the grace period ended")
			}
			stdout := sv.stdout.String()
			assert.Contains(t, stdout, tt.want, "the output after SIGTERM is still written")
			assert.Contains(t, stdout, "# Kubernetes is stopping the job's pod")
			assertLocalProgress(t, h.readProgress(), tt.wantStatus, tt.wantSignal, agentapi.SignalReasonAgentStop)
			assertNothingReachedBuildkite(t, h, before)
		})
	}
}

// TestMadeByHandBootstrap: a local job keeps the Bootstrap runner when it can, since trying
// an environment means its hooks, plugins and checkout. `buildkite-agent bootstrap` needs
// no Buildkite for them: it checks out the repository, skips sending the commit to
// Buildkite for want of a token, and what calls Buildkite fails at once. It needs a
// repository, though: without one the command runs under the Command runner, and the
// first line says so.
func TestMadeByHandBootstrap(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	const command = `echo "in $(basename "$PWD")"; cat hello.txt || true; buildkite-agent meta-data set key value || echo "no meta-data without Buildkite"; exit 2`
	tests := []struct {
		name string
		// unset are variables of the job's env, as Buildkite gives them, that the BuildJob
		// made by hand does not give.
		unset     []string
		wantFirst string
		want      []string
		unwanted  []string
	}{
		{
			name:      "a repository, commit and branch: bootstrap",
			wantFirst: localNotice,
			want: []string{
				"Preparing working directory",
				"Skipping sending Git information to Buildkite as $BUILDKITE_AGENT_ACCESS_TOKEN is missing",
				// Bootstrap runs the command in a pty, which ends lines with \r\n.
				"first version\r\n",
				"Missing agent-access-token",
				"no meta-data without Buildkite\r\n",
			},
		},
		{
			name:      "a repository alone: bootstrap checks out its default branch",
			unset:     []string{"BUILDKITE_COMMIT", "BUILDKITE_BRANCH", "BUILDKITE_ORGANIZATION_SLUG", "BUILDKITE_PIPELINE_SLUG", "BUILDKITE_PIPELINE_PROVIDER"},
			wantFirst: localNotice,
			want:      []string{"Preparing working directory", "in local\r\n", "second version\r\n", "no meta-data without Buildkite\r\n"},
		},
		{
			name:      "no repository: the Command runner, said in the first line",
			unset:     []string{"BUILDKITE_REPO"},
			wantFirst: localNotice + localCommandRunner,
			want:      []string{"~~~ Running commands", "in workspace\n", "Missing agent-access-token", "no meta-data without Buildkite\n"},
			unwanted:  []string{"Preparing working directory"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, before := newLocalHarness(t, fakebuildkite.BuildRequest{
				PipelineYAML: pipeline(command), Repo: repo, Commit: commits["first"], Branch: "main",
			})
			for _, k := range tt.unset {
				delete(h.job.Env, k)
			}
			h.env[podcontract.EnvRunner] = string(bkv1.RunnerBootstrap)
			h.env["PATH"] = binDir + ":" + os.Getenv("PATH")
			h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
			h.env["BUILDKITE_BIN_PATH"] = binDir
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			assert.Equal(t, 2, sv.wait(t, time.Minute))

			stdout := sv.stdout.String()
			first, _, _ := strings.Cut(stdout, "\n")
			assert.Equal(t, tt.wantFirst, first)
			for _, want := range tt.want {
				assert.Contains(t, stdout, want)
			}
			for _, unwanted := range tt.unwanted {
				assert.NotContains(t, stdout, unwanted)
			}
			assertLocalProgress(t, h.readProgress(), 2, "", "")
			assertNothingReachedBuildkite(t, h, before)
		})
	}
}
