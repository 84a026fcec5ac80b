package supervisor

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

func TestExitStatusIsReported(t *testing.T) {
	for _, code := range []int{0, 1, 3, 255} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
				PipelineYAML: pipeline("echo about to exit " + strconv.Itoa(code) + "; exit " + strconv.Itoa(code)),
			})
			got := h.start("--finish").wait(t, 30*time.Second)
			assert.Equal(t, code, got, "the supervisor exits with the command's exit code")

			snap := h.snapshot()
			assert.Equal(t, strconv.Itoa(code), snap.ExitStatus)
			assert.Empty(t, snap.Signal)
			assert.Empty(t, snap.SignalReason)
			assert.Equal(t, 1, snap.FinishCount)
			assert.Equal(t, 1, snap.StartCount)
			assert.Equal(t, fakebuildkite.StateFinished, snap.State)
			assert.Contains(t, fakebuildkite.PlainLog(snap.Log), "about to exit "+strconv.Itoa(code)+"\n")

			p := h.readProgress()
			assert.True(t, p.Started)
			assert.True(t, p.Exited)
			assert.True(t, p.Flushed)
			assert.Equal(t, code, p.ExitStatus)
			assert.Zero(t, p.FailedChunks)
			h.assertProgressMatchesFake(p)
		})
	}
}

func TestWithoutFinishTheJobStaysRunning(t *testing.T) {
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("echo hello; exit 7")})
	assert.Equal(t, 7, h.start().wait(t, 30*time.Second))
	snap := h.snapshot()
	assert.Zero(t, snap.FinishCount, "without --finish or --finish-flushed the controller finishes the job, not the supervisor")
	assert.Equal(t, fakebuildkite.StateRunning, snap.State)
	p := h.readProgress()
	assert.True(t, p.Exited && p.Flushed)
	assert.Equal(t, 7, p.ExitStatus)
	h.assertProgressMatchesFake(p)
	assert.Equal(t, "~~~ Running commands\n$ echo hello; exit 7\nhello\n", string(stripTimestamps(t, snap.Log)))
}

// TestFinishFlushed: as in a pod, the supervisor finishes the job once the command has
// ended and its output is sent, and records that it did, so that the controller does not.
func TestFinishFlushed(t *testing.T) {
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("echo hello; exit 3")})
	assert.Equal(t, 3, h.start("--"+podcontract.FinishFlushedFlag).wait(t, 30*time.Second))
	snap := h.snapshot()
	assert.Equal(t, 1, snap.FinishCount)
	assert.Equal(t, "3", snap.ExitStatus)
	assert.Equal(t, fakebuildkite.StateFinished, snap.State)
	p := h.readProgress()
	assert.True(t, p.Exited && p.Flushed && p.Finished, "progress %+v", p)
	h.assertProgressMatchesFake(p)
}

// TestFinishFlushedLeavesTheUnexplainedToTheController: as in a pod, a command killed by a
// signal the supervisor did not send (SIGKILL from the kernel's OOM killer), or stopped
// because the pod is being deleted, ends with a cause only Kubernetes knows. The supervisor
// then does not finish the job: the controller finishes it after writing that cause into the
// log (Buildkite takes no log once a job is finished).
func TestFinishFlushedLeavesTheUnexplainedToTheController(t *testing.T) {
	cases := []struct {
		name    string
		command string
		stop    bool
	}{
		{"killed by a signal it did not send", "echo going; kill -9 $$", false},
		{"told to stop: the pod is being deleted", "echo started; sleep 30", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tc.command)})
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			if tc.stop {
				h.waitLog("started", 20*time.Second)
				require.NoError(t, sv.cmd.Process.Signal(syscall.SIGTERM))
			}
			sv.wait(t, 30*time.Second)
			snap := h.snapshot()
			assert.Zero(t, snap.FinishCount, "the supervisor finished a job whose end it cannot explain; log:\n%s", snap.Log)
			p := h.readProgress()
			assert.True(t, p.Exited && p.Flushed, "progress %+v", p)
			assert.False(t, p.Finished, "progress %+v", p)
		})
	}
}

// mixedOutput returns n bytes of what jobs print: short and long lines, bytes that are not
// text (escape sequences, NULs, carriage returns), and no newline at the end.
func mixedOutput(n int) []byte {
	r := rand.New(rand.NewPCG(7, 11))
	out := make([]byte, 0, n+1)
	for len(out) < n {
		switch r.IntN(4) {
		case 0:
			out = append(out, "ok "...)
			out = strconv.AppendInt(out, int64(r.IntN(1000)), 10)
			out = append(out, '\n')
		case 1:
			for range r.IntN(300_000) {
				out = append(out, byte('a'+r.IntN(26)))
			}
			out = append(out, '\n')
		case 2:
			for range r.IntN(8192) {
				out = append(out, byte(r.IntN(256)))
			}
		default:
			out = append(out, "\x1b[32mPASS\x1b[0m TestSomething\r\n\n"...)
		}
	}
	out = out[:n]
	if out[n-1] == '\n' {
		out[n-1] = '.'
	}
	return out
}

func TestFiftyMegabytesArriveByteForByte(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 50 MB")
	}
	const size = 50 << 20
	data := mixedOutput(size)
	file := filepath.Join(t.TempDir(), "output")
	require.NoError(t, os.WriteFile(file, data, 0o644))
	command := "cat " + file
	h := newHarness(t, fakebuildkite.Options{ChunksMaxSizeBytes: 1 << 20}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})

	start := time.Now()
	sv := h.start("--finish")
	peak := sv.watchPeakRSS()
	require.Equal(t, 0, sv.wait(t, 2*time.Minute))
	t.Logf("50 MB streamed in %s", time.Since(start))

	snap := h.snapshot()
	assert.Equal(t, "0", snap.ExitStatus)
	got := stripTimestamps(t, snap.Log)
	want := append([]byte("~~~ Running commands\n$ "+command+"\n"), data...)
	if !bytes.Equal(want, got) {
		i := 0
		for i < min(len(want), len(got)) && want[i] == got[i] {
			i++
		}
		t.Fatalf("the log differs from the output at byte %d of %d (got %d bytes): want %q, got %q",
			i, len(want), len(got), head(want[i:]), head(got[i:]))
	}
	// The fake refuses a chunk above chunks_max_size_bytes with a 422.
	for _, r := range h.s.Requests() {
		if r.Endpoint == fakebuildkite.EPChunks {
			assert.Less(t, r.Status, 300, "a chunk was refused")
		}
	}
	p := h.readProgress()
	assert.True(t, p.Flushed)
	h.assertProgressMatchesFake(p)

	// Backpressure keeps the supervisor's memory bounded: about 20 MiB of Go runtime and test
	// binary, a few 1 MiB chunk buffers and the HTTP client's copies of one chunk. Buffering the
	// output would take the 50 MB and more.
	rss := (<-peak).RSS
	t.Logf("supervisor peak RSS: %d MiB", rss>>20)
	require.NotZero(t, rss, "could not read the supervisor's memory use")
	if raceEnabled {
		return
	}
	assert.Less(t, rss, int64(64<<20), "peak RSS %d bytes: output is being buffered", rss)
}

func TestCancel(t *testing.T) {
	tests := []struct {
		name    string
		command string
		// timeout makes the job time out on Buildkite instead of being canceled.
		timeout    bool
		wantStatus string
		wantSignal string
		wantLog    []string
		// killed: the command ignored SIGTERM and needed SIGKILL after the grace period.
		killed bool
	}{
		{
			name:       "the command traps SIGTERM and exits",
			command:    `trap 'echo trapped TERM; exit 3' TERM; echo ready; sleep 60 & wait`,
			wantStatus: "3",
			wantLog:    []string{"ready\n", "The job was canceled on Buildkite", "trapped TERM\n"},
		},
		{
			name:       "SIGTERM kills a command that does not trap it",
			command:    `echo ready; sleep 60`,
			wantStatus: "-1",
			wantSignal: "SIGTERM",
			wantLog:    []string{"ready\n"},
		},
		{
			name:       "SIGKILL after the grace period for a command that ignores SIGTERM",
			command:    `trap 'echo ignoring TERM' TERM; echo ready; while true; do sleep 0.1 || true; done`,
			wantStatus: "-1",
			wantSignal: "SIGKILL",
			wantLog:    []string{"ready\n", "ignoring TERM\n"},
			killed:     true,
		},
		{
			name:       "a timeout cancels too",
			command:    `trap 'echo trapped TERM; exit 5' TERM; echo ready; sleep 60 & wait`,
			timeout:    true,
			wantStatus: "5",
			wantLog:    []string{"ready\n", "The job timed out on Buildkite", "trapped TERM\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var extra []string
			opts := fakebuildkite.Options{}
			if tt.timeout {
				extra = append(extra, "timeout_in_minutes: 1")
				opts.MinuteDuration = 1500 * time.Millisecond
			}
			h := newHarness(t, opts, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tt.command, extra...)})
			sv := h.start("--finish")
			h.waitLog("ready\n", 20*time.Second)
			var canceledAt time.Time
			if !tt.timeout {
				canceledAt = time.Now()
				require.NoError(t, h.s.CancelJob(h.job.ID))
			}
			code := sv.wait(t, 30*time.Second)
			ended := time.Now()

			snap := h.snapshot()
			assert.Equal(t, tt.wantStatus, snap.ExitStatus)
			assert.Equal(t, tt.wantSignal, snap.Signal)
			assert.Equal(t, agentapi.SignalReasonCancel, snap.SignalReason)
			assert.Equal(t, 1, snap.FinishCount)
			log := fakebuildkite.PlainLog(snap.Log)
			for _, want := range tt.wantLog {
				assert.Contains(t, log, want)
			}
			if tt.killed {
				assert.Equal(t, 128+int(syscall.SIGKILL), code)
				// Polling takes up to 2 × 0.2 s, then the 1 s grace period.
				assert.GreaterOrEqual(t, ended.Sub(canceledAt), time.Second, "SIGKILL came before the grace period ended")
			} else if tt.wantSignal == "" {
				want, _ := strconv.Atoi(tt.wantStatus)
				assert.Equal(t, want, code)
			}
			p := h.readProgress()
			assert.Equal(t, tt.wantSignal, p.Signal)
			assert.Equal(t, agentapi.SignalReasonCancel, p.SignalReason)
			assert.True(t, p.Exited && p.Flushed)
			h.assertProgressMatchesFake(p)
		})
	}
}

func TestSupervisorSIGTERMStopsTheCommand(t *testing.T) {
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(`trap 'echo trapped TERM; exit 4' TERM; echo ready; sleep 60 & wait`),
	})
	sv := h.start()
	h.waitLog("ready\n", 20*time.Second)
	require.NoError(t, sv.cmd.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 4, sv.wait(t, 20*time.Second))
	snap := h.snapshot()
	assert.Contains(t, fakebuildkite.PlainLog(snap.Log), "trapped TERM\n", "the output after SIGTERM is still sent")
	p := h.readProgress()
	assert.True(t, p.Exited && p.Flushed)
	assert.Equal(t, 4, p.ExitStatus)
	assert.Equal(t, agentapi.SignalReasonAgentStop, p.SignalReason)
	h.assertProgressMatchesFake(p)
}

func TestRevokedTokenCancels(t *testing.T) {
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(`echo ready; sleep 60`)})
	sv := h.start()
	h.waitLog("ready\n", 20*time.Second)
	// Every job-state poll gets 401 from now on, as when the job token is revoked while the
	// job runs. (Before the start, a 401 says the job is over: TestJobOverBeforeStart.)
	h.s.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPJobState, Status: 401})
	assert.Equal(t, 128+int(syscall.SIGTERM), sv.wait(t, 20*time.Second))
	p := h.readProgress()
	assert.Equal(t, -1, p.ExitStatus)
	assert.Equal(t, "SIGTERM", p.Signal)
	assert.Equal(t, agentapi.SignalReasonCancel, p.SignalReason)
	assert.Contains(t, fakebuildkite.PlainLog(h.snapshot().Log), "no longer accepts this job's token")
}

func TestLogPaths(t *testing.T) {
	dir := t.TempDir()
	service := filepath.Join(dir, "service.log")
	later := filepath.Join(dir, "later.log")
	never := filepath.Join(dir, "never.log")
	command := strings.Join([]string{
		"echo command starts",
		"echo 'svc line 1' >> " + service,
		"sleep 0.5",
		"echo 'svc line 2' >> " + service,
		"echo 'later line' > " + later,
		"sleep 0.5",
		"printf 'svc tail without newline' >> " + service,
		"echo command ends",
	}, "; ")
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
	h.env[podcontract.EnvLogPaths] = service + ";" + later + "; " + never
	require.Equal(t, 0, h.start("--finish").wait(t, 30*time.Second))

	log := string(stripTimestamps(t, h.snapshot().Log))
	t.Logf("log:\n%s", log)
	assert.Contains(t, log, "--- :page_facing_up: "+service+"\nsvc line 1\n")
	assert.Contains(t, log, "svc line 2\n")
	assert.Contains(t, log, "--- :page_facing_up: "+later+"\nlater line\n")
	assert.Contains(t, log, "svc tail without newline\n", "what is left when the command ends is flushed")
	assert.NotContains(t, log, never, "a file that never appears gets no heading")
	assert.Equal(t, 1, strings.Count(log, "svc line 1\n"), "nothing twice")
	assert.Less(t, strings.Index(log, "svc line 1"), strings.Index(log, "svc line 2"))
	assert.Contains(t, log, "command starts\n")
	assert.Contains(t, log, "command ends\n")
}

func TestProgressSurvivesSIGKILL(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "command.pid")
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(
		`echo $$ > ` + pidfile + `; i=0; while true; do echo "line $i"; i=$((i+1)); sleep 0.005; done`)})
	h.env[podcontract.EnvChunkInterval] = "0.05"
	sv := h.start()
	t.Cleanup(func() {
		// The command is in its own process group and outlives the supervisor.
		if b, err := os.ReadFile(pidfile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	})
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(h.progress)
		return err == nil && bytes.Contains(b, []byte(`"seq":3`))
	}, 20*time.Second, 10*time.Millisecond, "the supervisor records each acknowledged chunk")

	// Hold the next chunk in flight, so that what Buildkite has is exactly what was
	// acknowledged, then kill the supervisor without warning, as the OOM killer would.
	h.s.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPChunks, Latency: time.Hour})
	require.Eventually(t, func() bool {
		for _, r := range h.s.Requests() {
			if r.Endpoint == fakebuildkite.EPChunks && r.Faulted {
				return true
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, sv.cmd.Process.Kill())
	sv.wait(t, 10*time.Second)

	p := h.readProgress()
	assert.True(t, p.Started)
	assert.False(t, p.Exited)
	assert.False(t, p.Flushed)
	assert.GreaterOrEqual(t, p.Sequence, uint64(3))
	h.assertProgressMatchesFake(p)
}

func TestConfigFromEnv(t *testing.T) {
	base := []string{
		podcontract.EnvEndpoint + "=http://bk/v3", podcontract.EnvAccessToken + "=bkaj_x",
		podcontract.EnvJobID + "=job-1", podcontract.EnvCommand + "=make",
	}
	tests := []struct {
		name    string
		env     []string
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{name: "defaults", check: func(t *testing.T, c Config) {
			assert.Equal(t, string(bkv1.DefaultRunner), c.Runner, "the API's default")
			assert.Equal(t, DefaultChunkMaxBytes, c.ChunkMaxBytes)
			assert.Equal(t, time.Second, c.ChunkInterval)
			assert.Equal(t, DefaultSignalGrace, c.SignalGrace)
			assert.Equal(t, "/dev/termination-log", c.ProgressPath)
			assert.Equal(t, podcontract.WorkspaceDir, c.Workspace)
			assert.Equal(t, int64(DefaultLogMaxBytes), c.LogMaxBytes, "the agent's default")
			assert.Zero(t, c.Timeout, "no timeout")
			assert.NoError(t, c.validate())
		}},
		{name: "everything set", env: []string{
			podcontract.EnvRunner + "=Bootstrap", podcontract.EnvLogPaths + "=/a.log; /b.log;",
			podcontract.EnvChunkMaxBytes + "=1024", podcontract.EnvChunkInterval + "=0.5",
			podcontract.EnvJobStatusInterval + "=3", podcontract.EnvSignalGrace + "=20",
			podcontract.EnvProgressPath + "=/tmp/p", podcontract.EnvLogMaxBytes + "=2097152",
			podcontract.EnvTimeoutSeconds + "=604800", podcontract.EnvTimeoutSource + "=" + podcontract.TimeoutSourceEnvironment,
		}, check: func(t *testing.T, c Config) {
			assert.Equal(t, string(bkv1.RunnerBootstrap), c.Runner)
			assert.Equal(t, []string{"/a.log", "/b.log"}, c.LogPaths)
			assert.Equal(t, 1024, c.ChunkMaxBytes)
			assert.Equal(t, 500*time.Millisecond, c.ChunkInterval)
			assert.Equal(t, 3*time.Second, c.JobStatusInterval)
			assert.Equal(t, 20*time.Second, c.SignalGrace)
			assert.Equal(t, "/tmp/p", c.ProgressPath)
			assert.Equal(t, int64(2<<20), c.LogMaxBytes)
			assert.Equal(t, 10080*time.Minute, c.Timeout, "the longest timeout a BuildJob may have")
			assert.Equal(t, podcontract.TimeoutSourceEnvironment, c.TimeoutSource)
		}},
		{name: "a log limit that is not a number is named", env: []string{podcontract.EnvLogMaxBytes + "=1 GiB"},
			wantErr: podcontract.EnvLogMaxBytes},
		{name: "a timeout past a week is named", env: []string{podcontract.EnvTimeoutSeconds + "=604801"},
			wantErr: podcontract.EnvTimeoutSeconds},
		{name: "a negative timeout is named", env: []string{podcontract.EnvTimeoutSeconds + "=-60"},
			wantErr: podcontract.EnvTimeoutSeconds},
		{name: "bad numbers are named", env: []string{podcontract.EnvChunkMaxBytes + "=lots", podcontract.EnvSignalGrace + "=-1"},
			wantErr: podcontract.EnvChunkMaxBytes},
		{name: "unknown runner", env: []string{podcontract.EnvRunner + "=Docker"}, check: func(t *testing.T, c Config) {
			assert.ErrorContains(t, c.validate(), "use Command or Bootstrap")
		}},
		{name: "missing token", env: []string{podcontract.EnvAccessToken + "="}, check: func(t *testing.T, c Config) {
			assert.ErrorContains(t, c.validate(), podcontract.EnvAccessToken+" is not set")
		}},
		{name: "not local: token and endpoint still needed", env: []string{
			podcontract.EnvLocal + "=false", podcontract.EnvAccessToken + "=", podcontract.EnvEndpoint + "=",
		}, check: func(t *testing.T, c Config) {
			assert.False(t, c.Local)
			assert.ErrorContains(t, c.validate(), podcontract.EnvAccessToken+" is not set")
			assert.ErrorContains(t, c.validate(), podcontract.EnvEndpoint+" is not set")
		}},
		{name: "local: made by hand, no token or endpoint needed", env: []string{
			podcontract.EnvLocal + "=true", podcontract.EnvAccessToken + "=", podcontract.EnvEndpoint + "=",
		}, check: func(t *testing.T, c Config) {
			assert.True(t, c.Local)
			assert.NoError(t, c.validate())
		}},
		{name: "local: the job ID and command are still needed", env: []string{
			podcontract.EnvLocal + "=true", podcontract.EnvAccessToken + "=", podcontract.EnvEndpoint + "=",
			podcontract.EnvJobID + "=", podcontract.EnvRunner + "=Command", podcontract.EnvCommand + "=",
		}, check: func(t *testing.T, c Config) {
			err := c.validate()
			assert.ErrorContains(t, err, podcontract.EnvJobID+" is not set")
			assert.ErrorContains(t, err, podcontract.EnvCommand+" is not set")
			assert.NotContains(t, err.Error(), podcontract.EnvAccessToken)
		}},
		{name: "local: a value that is not a bool is named", env: []string{podcontract.EnvLocal + "=yes please"},
			wantErr: podcontract.EnvLocal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ConfigFromEnv(append(append([]string(nil), base...), tt.env...))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestIncompleteEnvironmentIsExplained(t *testing.T) {
	progress := filepath.Join(t.TempDir(), "termination-log")
	var stderr bytes.Buffer
	code := Main([]string{"--workspace", t.TempDir()}, []string{
		podcontract.EnvProgressPath + "=" + progress, podcontract.EnvCommand + "=true",
	}, &stderr)
	assert.Equal(t, 1, code)
	for _, name := range []string{podcontract.EnvEndpoint, podcontract.EnvAccessToken, podcontract.EnvJobID} {
		assert.Contains(t, stderr.String(), name+" is not set")
	}
	b, err := os.ReadFile(progress)
	require.NoError(t, err)
	assert.Contains(t, string(b), podcontract.EnvAccessToken+" is not set", "the controller learns why from the termination message")
}
