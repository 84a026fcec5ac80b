package supervisor

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// helperEnv makes the test binary act as `agentd supervise`, so that tests run the supervisor
// as a real process (signals, exit codes, SIGKILL) without building agentd.
const helperEnv = "SUPERVISOR_TEST_AS_AGENTD_SUPERVISE"

// testDefaultShellEnv points the supervisor's idea of the agent's default shell elsewhere, so
// that a test on a machine with bash can see what an image without it gets.
const testDefaultShellEnv = "TEST_AGENT_DEFAULT_SHELL"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		if sh := os.Getenv(testDefaultShellEnv); sh != "" {
			agentDefaultShell = sh
		}
		os.Exit(Main(os.Args[1:], os.Environ(), os.Stderr))
	}
	os.Exit(m.Run())
}

// harness is one job on a fake Buildkite, ready for a supervisor to run.
type harness struct {
	t        testing.TB
	s        *fakebuildkite.Server
	job      fakebuildkite.AcceptedJob
	dir      string
	progress string
	ws       string
	// env is added to the supervisor's environment, after the job's.
	env map[string]string
	// attr, when set, starts the supervisor process with these attributes (a new PID
	// namespace, to run it as PID 1 as in its container).
	attr *syscall.SysProcAttr
	// command, when set, runs the supervisor instead of the test binary: a binary and the
	// arguments before the supervisor's own, such as [agentd-supervise] or [agentd supervise].
	command []string
	// local runs the job as the pod of a BuildJob made by hand does: podcontract.EnvLocal,
	// and neither the job token nor the agent endpoint (env may still add them).
	local bool
}

// newHarness starts a fake, creates a build from req and takes its job as an agent would.
func newHarness(t testing.TB, opts fakebuildkite.Options, req fakebuildkite.BuildRequest) *harness {
	t.Helper()
	s := fakebuildkite.StartForTest(t, opts)
	_, err := s.CreateBuild(req)
	require.NoError(t, err)
	job := s.AcceptJobForTest(t, "supervisor-test", "queue=supervisor")
	dir := t.TempDir()
	return &harness{
		t: t, s: s, job: job, dir: dir,
		progress: filepath.Join(dir, "termination-log"),
		ws:       filepath.Join(dir, "workspace"),
		env: map[string]string{
			podcontract.EnvChunkMaxBytes:     strconv.FormatUint(job.ChunksMaxSizeBytes, 10),
			podcontract.EnvChunkInterval:     "0.2",
			podcontract.EnvJobStatusInterval: "0.2",
			podcontract.EnvSignalGrace:       "1",
			// The runner the tests mean unless they say otherwise; bkv1.DefaultRunner
			// needs buildkite-agent.
			podcontract.EnvRunner: string(bkv1.RunnerCommand),
			// The fake sends its own default, as Buildkite does, when the test sets none.
			podcontract.EnvLogMaxBytes: strconv.FormatInt(cmp.Or(opts.LogMaxSizeBytes, 1<<30), 10),
			// bootstrap's Job API socket under a short path (socketsDir), whichever test
			// runs bootstrap.
			"BUILDKITE_SOCKETS_PATH": socketsDir(t),
		},
	}
}

// pipeline is a one-step pipeline for the supervisor's queue.
func pipeline(command string, extra ...string) string {
	var b strings.Builder
	b.WriteString("steps:\n  - command: " + strconv.Quote(command) + "\n    agents: {queue: supervisor}\n")
	for _, e := range extra {
		b.WriteString("    " + e + "\n")
	}
	return b.String()
}

// supervisor is a running `agentd supervise`.
type supervisor struct {
	cmd *exec.Cmd
	// stderr has all it printed, stdout and stderr; stdout has its stdout alone.
	stderr *testkit.SyncBuffer
	stdout *testkit.SyncBuffer
	done   chan struct{}
	err    error
}

// start runs the supervisor for the harness's job with the job's environment, as the pod
// builder would set it up.
func (h *harness) start(args ...string) *supervisor {
	h.t.Helper()
	env := []string{helperEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + h.dir}
	for k, v := range h.job.Env {
		env = append(env, k+"="+v)
	}
	if h.local {
		env = append(env, podcontract.EnvLocal+"=true")
	} else {
		env = append(env,
			podcontract.EnvAccessToken+"="+h.job.Token,
			podcontract.EnvEndpoint+"="+h.s.Endpoint(),
		)
	}
	env = append(env,
		podcontract.EnvProgressPath+"="+h.progress,
		podcontract.EnvPodMarker+"=true",
	)
	for k, v := range h.env {
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(os.Args[0], append([]string{"--workspace", h.ws}, args...)...)
	if len(h.command) > 0 {
		cmd = exec.Command(h.command[0], append(append(h.command[1:len(h.command):len(h.command)], "--workspace", h.ws), args...)...)
	}
	cmd.Env = env
	cmd.SysProcAttr = h.attr
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
		// Whatever happened, the token must never have been printed.
		assert.NotContains(h.t, sv.stderr.String(), h.job.Token, "the supervisor printed the job token")
	})
	return sv
}

// wait waits for the supervisor to exit and returns its exit code.
func (sv *supervisor) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-sv.done:
	case <-time.After(timeout):
		t.Fatalf("the supervisor did not exit within %s; its output:\n%s", timeout, sv.stderr.String())
	}
	t.Logf("supervisor output:\n%s", sv.stderr.String())
	return sv.cmd.ProcessState.ExitCode()
}

// memory is the supervisor's peak memory, sampled from /proc.
type memory struct {
	// RSS is the peak resident set (VmHWM; wait4's maxrss would include the memory of the
	// test process it was forked from): private memory, and the pages of the binary that
	// were touched, which the page cache shares.
	RSS int64
	// Anon is the largest private (anonymous) resident memory seen: the heap, stacks, the
	// runtime's own.
	Anon int64
}

// watchPeakRSS samples the supervisor's memory until it exits.
func (sv *supervisor) watchPeakRSS() <-chan memory {
	out := make(chan memory, 1)
	go func() {
		var peak memory
		path := fmt.Sprintf("/proc/%d/status", sv.cmd.Process.Pid)
		for {
			select {
			case <-sv.done:
				out <- peak
				return
			case <-time.After(10 * time.Millisecond):
			}
			b, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				name, v, _ := strings.Cut(line, ":")
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				switch {
				case err != nil:
				case name == "VmHWM":
					peak.RSS = max(peak.RSS, kb*1024)
				case name == "RssAnon":
					peak.Anon = max(peak.Anon, kb*1024)
				}
			}
		}
	}()
	return out
}

// snapshot returns the job as the fake holds it.
func (h *harness) snapshot() fakebuildkite.JobSnapshot {
	h.t.Helper()
	snap, ok := h.s.Job(h.job.ID)
	require.True(h.t, ok)
	return snap
}

// waitLog waits until the fake's log (timestamps stripped) contains text.
func (h *harness) waitLog(text string, timeout time.Duration) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := h.s.WaitJob(ctx, h.job.ID, func(j fakebuildkite.JobSnapshot) bool {
		return strings.Contains(fakebuildkite.PlainLog(j.Log), text)
	})
	require.NoError(h.t, err, "waiting for %q in the log; it has:\n%s", text, fakebuildkite.PlainLog(h.snapshot().Log))
}

// readProgress reads the termination message file.
func (h *harness) readProgress() jobprogress.Progress {
	h.t.Helper()
	b, err := os.ReadFile(h.progress)
	require.NoError(h.t, err)
	p, err := jobprogress.Decode(string(b))
	require.NoError(h.t, err)
	return p
}

// assertProgressMatchesFake checks that the progress record says exactly how far the fake's
// log got.
func (h *harness) assertProgressMatchesFake(p jobprogress.Progress) {
	h.t.Helper()
	snap := h.snapshot()
	assert.Equal(h.t, uint64(snap.ChunkCount), p.Sequence, "chunks")
	assert.Equal(h.t, uint64(len(snap.Log)), p.Offset, "bytes")
}

var lineTS = regexp.MustCompile(`^\x1b_bk;t=[0-9]{13}\x07`)

// stripTimestamps removes the inline timestamp at the start of every line; a line without one,
// or a timestamp anywhere else, is an error.
func stripTimestamps(t *testing.T, log []byte) []byte {
	t.Helper()
	out := make([]byte, 0, len(log))
	for len(log) > 0 {
		loc := lineTS.FindIndex(log)
		if loc == nil {
			t.Fatalf("a line at offset %d has no timestamp at its start: %q", len(out), head(log))
		}
		log = log[loc[1]:]
		i := bytes.IndexByte(log, '\n')
		if i < 0 {
			out = append(out, log...)
			break
		}
		out = append(out, log[:i+1]...)
		log = log[i+1:]
	}
	return out
}

func head(b []byte) []byte {
	if len(b) > 100 {
		return b[:100]
	}
	return b
}
