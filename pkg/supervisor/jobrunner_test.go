package supervisor

import (
	"os"
	"path/filepath"
	"slices"
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

// The duties of the agent's JobRunner that the supervisor has in the pod: the log size
// limit, the end of the output after the command, the job's own timeout and the cancel
// timing bootstrap gets.

// TestLogMaxSize: past Buildkite's log_max_size_bytes the agent goes on sending and warns
// once in its own log; so does the supervisor, in its stderr (kubectl logs).
func TestLogMaxSize(t *testing.T) {
	const warning = "past the most Buildkite keeps of it (log_max_size_bytes"
	// About 30 KB of output, in 4 KiB chunks.
	command := `for i in $(seq 1 1000); do echo "line $i of the job's output"; done`
	tests := []struct {
		name     string
		limit    int64
		wantWarn bool
	}{
		{name: "within the limit", limit: 1 << 20},
		{name: "past the limit", limit: 8 << 10, wantWarn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fakebuildkite.Options{ChunksMaxSizeBytes: 4096, LogMaxSizeBytes: tt.limit}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			require.Equal(t, 0, sv.wait(t, 30*time.Second))

			snap := h.snapshot()
			log := fakebuildkite.PlainLog(snap.Log)
			assert.Contains(t, log, "line 1 of the job's output\n")
			assert.Contains(t, log, "line 1000 of the job's output\n", "output past the limit is sent all the same")
			assert.Equal(t, "0", snap.ExitStatus)
			if tt.wantWarn {
				assert.Greater(t, int64(len(snap.Log)), tt.limit)
				assert.Equal(t, 1, strings.Count(sv.stderr.String(), warning), "the warning, once, in the supervisor's log")
				assert.Contains(t, sv.stderr.String(), "(log_max_size_bytes, 8.0 KiB)")
				assert.NotContains(t, log, warning, "the job's log does not say it: it would be past the limit too")
			} else {
				assert.NotContains(t, sv.stderr.String(), warning)
			}
			p := h.readProgress()
			assert.True(t, p.Flushed && p.Finished, "progress %+v", p)
			h.assertProgressMatchesFake(p)
		})
	}
}

// TestOutputAfterExit: a background process that keeps printing, or only holds the output
// open, after the command (or bootstrap) has exited does not keep the job open: the
// supervisor stops reading 10 s after the exit, as the agent does, says so in the log, and
// the job finishes with the exit status of what it ran.
func TestOutputAfterExit(t *testing.T) {
	tests := []struct {
		name    string
		command string
		// standIn, when set, is a bootstrap stand-in (a buildkite-agent script) run by the
		// Bootstrap runner; the step's command is then not run.
		standIn  string
		wantCode int
		wantLog  []string
	}{
		{
			name:     "a chatty background process",
			command:  `(while true; do echo tick; sleep 0.2; done) & echo done-$((1+1)); exit 3`,
			wantCode: 3,
			wantLog:  []string{"tick\n"},
		},
		{
			name:     "a silent background process",
			command:  `sleep 120 & echo done-$((1+1))`,
			wantCode: 0,
		},
		{
			name:     "bootstrap leaves a chatty process behind",
			standIn:  "#!/bin/sh\n(while true; do echo tick; sleep 0.2; done) &\necho done-$((1+1))\nexit 4\n",
			wantCode: 4,
			wantLog:  []string{"tick\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tt.command)})
			if tt.standIn != "" {
				dir := t.TempDir()
				require.NoError(t, os.WriteFile(filepath.Join(dir, "buildkite-agent"), []byte(tt.standIn), 0o755))
				h.env[podcontract.EnvRunner] = string(bkv1.RunnerBootstrap)
				h.env["BUILDKITE_BIN_PATH"] = dir
			}
			killGroupOnCleanup(t, h)
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			// What it prints, not the command the log shows before it.
			h.waitLog("done-2\n", 20*time.Second)
			exited := time.Now()
			code := sv.wait(t, 40*time.Second)
			took := time.Since(exited)
			t.Logf("the job ended %s after the command's output", took)

			assert.Equal(t, tt.wantCode, code)
			snap := h.snapshot()
			assert.Equal(t, strconv.Itoa(tt.wantCode), snap.ExitStatus)
			assert.Empty(t, snap.SignalReason)
			assert.Equal(t, fakebuildkite.StateFinished, snap.State)
			log := fakebuildkite.PlainLog(snap.Log)
			for _, want := range tt.wantLog {
				assert.Contains(t, log, want)
			}
			assert.Contains(t, log, "# The command has exited, but processes it started still held its output open 10s later")
			// took starts when the test saw the output, a little after the exit.
			assert.GreaterOrEqual(t, took, 6*time.Second, "the supervisor waits for the output as long as the agent does (10 s)")
			assert.Less(t, took, 25*time.Second)
			p := h.readProgress()
			assert.True(t, p.Flushed && p.Finished, "progress %+v", p)
			h.assertProgressMatchesFake(p)
		})
	}
}

// killGroupOnCleanup kills, once the test ends, what the harness's job left running: its
// processes are in process groups of their own, which outlive the supervisor outside a pod.
func killGroupOnCleanup(t *testing.T, h *harness) {
	t.Helper()
	// The harness's folder is the test's own: no other test's processes have it.
	marker := "\x00BK_OPERATOR_TEST_MARKER=" + h.dir + "\x00"
	h.env["BK_OPERATOR_TEST_MARKER"] = h.dir
	t.Cleanup(func() {
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
			if err == nil && strings.Contains("\x00"+string(env), marker) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// TestTimeout: the job's own timeout (the plugin's timeout_in_minutes, or its
// BuildEnvironment's default), which Buildkite knows nothing of, stops the command at the
// deadline as a cancel does, says in the log which timeout it was, and the supervisor
// finishes the job at once: exit status -1, signal reason cancel.
func TestTimeout(t *testing.T) {
	tests := []struct {
		name    string
		command string
		source  string
		// timeoutFile gives the job a BUILDKITE_AGENT_JOB_TIMEOUT_FILE.
		timeoutFile bool
		wantSignal  string
		wantCode    int
		wantLog     []string
		// killed: the command ignored SIGTERM, and the grace period (1 s) passed.
		killed bool
	}{
		{
			name:        "the step's timeout; the command exits 0 on SIGTERM",
			command:     `trap 'echo "trapped TERM, timed out: $(cat $BUILDKITE_AGENT_JOB_TIMEOUT_FILE)"; exit 0' TERM; echo ready; sleep 60 & wait`,
			source:      podcontract.TimeoutSourceStep,
			timeoutFile: true,
			wantCode:    0,
			wantLog: []string{
				"# The job ran past its timeout of 2s, set by the step (the buildkite-operator plugin's timeout_in_minutes, or BK_OPERATOR_TIMEOUT_IN_MINUTES): sent SIGTERM to the command; SIGKILL follows if it is still running 1s later",
				"trapped TERM, timed out: true\n",
			},
		},
		{
			name:       "the environment's default; SIGTERM ends the command",
			command:    `echo ready; sleep 60`,
			source:     podcontract.TimeoutSourceEnvironment,
			wantSignal: "SIGTERM",
			wantCode:   128 + int(syscall.SIGTERM),
			wantLog:    []string{"# The job ran past its timeout of 2s, its BuildEnvironment's default (spec.timeouts.defaultMinutes"},
		},
		{
			name:       "a command that ignores SIGTERM gets SIGKILL after the grace period",
			command:    `trap 'echo ignoring TERM' TERM; echo ready; while true; do sleep 0.1 || true; done`,
			source:     podcontract.TimeoutSourceStep,
			wantSignal: "SIGKILL",
			wantCode:   128 + int(syscall.SIGKILL),
			wantLog:    []string{"ignoring TERM\n"},
			killed:     true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tt.command)})
			h.env[podcontract.EnvTimeoutSeconds] = "2"
			h.env[podcontract.EnvTimeoutSource] = tt.source
			marker := filepath.Join(h.dir, "job-timeout")
			if tt.timeoutFile {
				h.env[envJobTimeoutFile] = marker
			}
			// Should the timeout not fire, the command must not outlive the test.
			killGroupOnCleanup(t, h)
			start := time.Now()
			sv := h.start("--" + podcontract.FinishFlushedFlag)
			h.waitLog("ready\n", 20*time.Second)
			code := sv.wait(t, 30*time.Second)
			took := time.Since(start)
			t.Logf("the job ended %s after the supervisor started", took)

			assert.Equal(t, tt.wantCode, code, "the container's exit code is the command's")
			snap := h.snapshot()
			assert.Equal(t, "-1", snap.ExitStatus, "a job past its timeout fails, whatever its command exits with")
			assert.Equal(t, tt.wantSignal, snap.Signal)
			assert.Equal(t, agentapi.SignalReasonCancel, snap.SignalReason)
			assert.Equal(t, fakebuildkite.StateFinished, snap.State)
			assert.Equal(t, 1, snap.FinishCount)
			log := fakebuildkite.PlainLog(snap.Log)
			for _, want := range tt.wantLog {
				assert.Contains(t, log, want)
			}
			assert.GreaterOrEqual(t, took, 2*time.Second, "the timeout came early")
			if tt.killed {
				assert.GreaterOrEqual(t, took, 3*time.Second, "SIGKILL came before the grace period ended")
			}
			assert.Less(t, took, 10*time.Second, "the job is finished at once, not at the pod's deadline")
			p := h.readProgress()
			assert.True(t, p.Exited && p.Flushed && p.Finished, "progress %+v", p)
			assert.Equal(t, -1, p.ExitStatus)
			assert.Equal(t, agentapi.SignalReasonCancel, p.SignalReason)
			assert.NoFileExists(t, marker, "the timeout marker is removed once the job has ended")
		})
	}
}

// TestWithinTheTimeout: a job that ends before its timeout is reported as it ended, and a
// timeout marker path it was given (here a file of its own) is left alone.
func TestWithinTheTimeout(t *testing.T) {
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(`echo quick; exit 2`)})
	h.env[podcontract.EnvTimeoutSeconds] = "600"
	h.env[podcontract.EnvTimeoutSource] = podcontract.TimeoutSourceStep
	own := filepath.Join(h.dir, "the-jobs-own-file")
	require.NoError(t, os.WriteFile(own, []byte("keep me"), 0o644))
	h.env[envJobTimeoutFile] = own
	assert.Equal(t, 2, h.start("--"+podcontract.FinishFlushedFlag).wait(t, 30*time.Second))
	snap := h.snapshot()
	assert.Equal(t, "2", snap.ExitStatus)
	assert.Empty(t, snap.SignalReason)
	assert.NotContains(t, fakebuildkite.PlainLog(snap.Log), "timeout")
	assert.FileExists(t, own, "the supervisor removes only a timeout marker it wrote")
}

func TestTimeoutNotice(t *testing.T) {
	tests := []struct {
		d      time.Duration
		source string
		want   string
	}{
		{30 * time.Minute, podcontract.TimeoutSourceStep, "The job ran past its timeout of 30 minutes, set by the step (the buildkite-operator plugin's timeout_in_minutes, or BK_OPERATOR_TIMEOUT_IN_MINUTES)"},
		{time.Minute, podcontract.TimeoutSourceEnvironment, "The job ran past its timeout of 1 minute, its BuildEnvironment's default (spec.timeouts.defaultMinutes; a step may choose another with the buildkite-operator plugin's timeout_in_minutes)"},
		{90 * time.Second, "", "The job ran past its timeout of 1m30s"},
		{10080 * time.Minute, "something new", "The job ran past its timeout of 10080 minutes"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, timeoutNotice(tt.d, tt.source))
	}
}

// TestCancelTimingEnv: the job, and so bootstrap of either generation, gets the
// supervisor's cancel timing in the agent's variables, whatever the job's env says.
func TestCancelTimingEnv(t *testing.T) {
	show := `echo "v3: $BUILDKITE_SIGNAL_GRACE_PERIOD_SECONDS $BUILDKITE_CANCEL_GRACE_PERIOD v4: $BUILDKITE_CANCEL_SIGNAL_TIMEOUT $BUILDKITE_CANCEL_CLEANUP_TIMEOUT"`
	tests := []struct {
		name  string
		grace string
		env   map[string]string
		want  string
	}{
		{name: "the pod's grace period", grace: "25", want: "v3: 25 30 v4: 25s 5s"},
		{name: "the environment's cancelGracePeriodSeconds", grace: "40", want: "v3: 40 45 v4: 40s 5s"},
		{name: "a fraction is cut to whole seconds, as v3 takes them", grace: "2.5", want: "v3: 2 7 v4: 2s 5s"},
		{
			name:  "the job's env does not choose them",
			grace: "7",
			env:   map[string]string{envSignalGracePeriod: "99", envCancelGracePeriod: "3", envCancelSignalTimeout: "1h"},
			want:  "v3: 7 12 v4: 7s 5s",
		},
	}
	for _, tt := range tests {
		for _, runner := range []bkv1.RunnerMode{bkv1.RunnerCommand, bkv1.RunnerBootstrap} {
			t.Run(tt.name+"/"+string(runner), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(show)})
				h.env[podcontract.EnvSignalGrace] = tt.grace
				for k, v := range tt.env {
					h.env[k] = v
				}
				if runner == bkv1.RunnerBootstrap {
					// A stand-in that runs the command as bootstrap would, with its env.
					dir := t.TempDir()
					require.NoError(t, os.WriteFile(filepath.Join(dir, "buildkite-agent"), []byte("#!/bin/sh\nexec /bin/sh -c \"$BUILDKITE_COMMAND\"\n"), 0o755))
					h.env[podcontract.EnvRunner] = string(runner)
					h.env["BUILDKITE_BIN_PATH"] = dir
				}
				require.Equal(t, 0, h.start("--finish").wait(t, 30*time.Second))
				assert.Contains(t, "\n"+fakebuildkite.PlainLog(h.snapshot().Log), "\n"+tt.want+"\n")
			})
		}
	}
}

// TestCancelEndsWhenTheGroupDoes: on a cancel, the supervisor waits for what the command
// left in its process group as long as it runs, not for the whole grace period: a
// background process that takes a second to exit on SIGTERM ends the job then. (It waited
// for the SIGKILL at the end of the grace period whenever anything of the group was there
// the moment the command exited, a zombie not yet reaped included.)
func TestCancelEndsWhenTheGroupDoes(t *testing.T) {
	command := `trap 'exit 3' TERM; sh -c 'trap "sleep 1; exit 0" TERM; while :; do sleep 0.1; done' >/dev/null 2>&1 & echo ready; wait`
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
	h.env[podcontract.EnvSignalGrace] = "15"
	killGroupOnCleanup(t, h)
	sv := h.start("--" + podcontract.FinishFlushedFlag)
	h.waitLog("ready\n", 20*time.Second)
	canceled := time.Now()
	require.NoError(t, h.s.CancelJob(h.job.ID))
	assert.Equal(t, 3, sv.wait(t, 30*time.Second))
	took := time.Since(canceled)
	t.Logf("the job ended %s after the cancel", took)
	assert.GreaterOrEqual(t, took, time.Second, "the background process's second")
	assert.Less(t, took, 8*time.Second, "the supervisor waited for the grace period (15 s) when nothing was left to kill")
	snap := h.snapshot()
	assert.Equal(t, "3", snap.ExitStatus)
	assert.Equal(t, agentapi.SignalReasonCancel, snap.SignalReason)
}

// TestBootstrapCancelTiming cancels a job whose command ignores SIGTERM under the real
// bootstrap: the job ends at the end of the grace period the supervisor gave bootstrap
// (BUILDKITE_SIGNAL_GRACE_PERIOD_SECONDS, and the v4 names), not when the command would.
// Bootstrap v3.138.1 also refuses to start unless BUILDKITE_CANCEL_GRACE_PERIOD exceeds
// the signal grace period, which the supervisor's values satisfy.
func TestBootstrapCancelTiming(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(`trap 'echo "trapped TERM with $BUILDKITE_SIGNAL_GRACE_PERIOD_SECONDS s"; sleep 45' TERM; echo ready; sleep 60 & wait`),
		Repo:         repo, Commit: commits["first"], Branch: "main",
	})
	useBootstrap(h, binDir)
	h.env[podcontract.EnvSignalGrace] = "3"
	killGroupOnCleanup(t, h)
	sv := h.start("--" + podcontract.FinishFlushedFlag)
	h.waitLog("ready", 30*time.Second)
	canceled := time.Now()
	require.NoError(t, h.s.CancelJob(h.job.ID))
	sv.wait(t, 40*time.Second)
	took := time.Since(canceled)
	snap := h.snapshot()
	log := fakebuildkite.PlainLog(snap.Log)
	t.Logf("ended %s after the cancel: exit status %q, signal %q, reason %q; log:\n%s", took, snap.ExitStatus, snap.Signal, snap.SignalReason, log)
	assert.Contains(t, log, "trapped TERM with 3 s")
	assert.GreaterOrEqual(t, took, 3*time.Second)
	assert.Less(t, took, 15*time.Second)
	assert.Equal(t, agentapi.SignalReasonCancel, snap.SignalReason)
	assert.Equal(t, 1, snap.FinishCount)
	assert.NotContains(t, log, "must be greater than", "bootstrap refused the cancel timing")
}

// TestBootstrapEarlyCancel stops jobs at many moments just after bootstrap has started,
// the e2e suite's flaky timeout: every one must end well within the grace period. The
// supervisor signals bootstrap's own process group (bootstrap is its leader), and a
// SIGTERM before bootstrap has its handler ends bootstrap at once; but bootstrap v3.52.0
// drops a cancel that comes after its handler is in place and before it starts the
// command's process (it prints "Received cancellation signal", interrupts no process, and
// runs the command anyway), which then runs until the SIGKILL at the end of the grace
// period. Bootstrap v3.138.1 cancels the whole job instead: this test passes with it, and
// fails now and then with v3.52.0.
func TestBootstrapEarlyCancel(t *testing.T) {
	binDir := agentBinDir(t)
	const grace = 8 * time.Second
	for delay := time.Duration(0); delay <= 120*time.Millisecond; delay += 4 * time.Millisecond {
		h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(`echo ready; while true; do sleep 1; done`)})
		useBootstrap(h, binDir)
		// The command phase only: the race is bootstrap's, whatever comes before the command.
		h.env["BUILDKITE_REPO"] = "/nonexistent"
		h.env["BUILDKITE_BOOTSTRAP_PHASES"] = "command"
		h.env[podcontract.EnvSignalGrace] = strconv.Itoa(int(grace / time.Second))
		killGroupOnCleanup(t, h)
		sv := h.start()
		require.Eventually(t, func() bool { return childWith(sv.cmd.Process.Pid, "bootstrap") != 0 }, 20*time.Second, time.Millisecond)
		time.Sleep(delay)
		// The supervisor's own SIGTERM stops the job as a cancel does, at a moment the test
		// chooses (a cancel on Buildkite comes at the next poll of the job's state).
		stopped := time.Now()
		require.NoError(t, sv.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-sv.done:
		case <-time.After(3 * grace):
			t.Fatalf("the supervisor did not exit %s after its SIGTERM", 3*grace)
		}
		took := time.Since(stopped)
		log := fakebuildkite.PlainLog(h.snapshot().Log)
		if !assert.Less(t, took, grace/2, "stopped %s after bootstrap started: the job ended only %s later (SIGKILL at the end of the grace period); bootstrap said:\n%s", delay, took, log) {
			continue
		}
	}
}

// childWith is the pid of a child of ppid whose command line has arg, 0 when there is none.
func childWith(ppid int, arg string) int {
	for _, c := range childrenOf(ppid) {
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c.pid), "cmdline"))
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			return c.pid
		}
	}
	return 0
}
