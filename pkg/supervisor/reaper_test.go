package supervisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// childProcess is a child of a process, as /proc shows it.
type childProcess struct {
	pid   int
	state string // R, S, Z, ...
}

// childrenOf lists the children of ppid, from /proc.
func childrenOf(ppid int) []childProcess {
	entries, _ := os.ReadDir("/proc")
	var out []childProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) >= 2 && f[1] == strconv.Itoa(ppid) {
			out = append(out, childProcess{pid: pid, state: f[0]})
		}
	}
	return out
}

// zombiesOf lists the zombie children of pid, from /proc.
func zombiesOf(pid int) []int {
	var out []int
	for _, c := range childrenOf(pid) {
		if c.state == "Z" {
			out = append(out, c.pid)
		}
	}
	return out
}

// newPIDNamespace returns the attributes that start a process as PID 1 of a new PID
// namespace, as the supervisor is in its container, or skips the test where that is not
// allowed.
func newPIDNamespace(t *testing.T) *syscall.SysProcAttr {
	t.Helper()
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = attr
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot make a PID namespace here (%v): the supervisor cannot be run as PID 1", err)
	}
	return attr
}

// TestReapsOrphans: processes the command leaves behind are adopted by the supervisor, PID 1
// of its container (or a subreaper elsewhere), which must reap them when they exit, or they
// stay zombies until the pod ends; and reaping must not take the command's own exit status.
func TestReapsOrphans(t *testing.T) {
	tests := []struct {
		name  string
		pidNS bool
	}{
		{name: "as PID 1 of its PID namespace", pidNS: true},
		{name: "as a child process (a subreaper)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Each inner shell starts a short sleep in the background and exits at once:
			// the sleeps are orphans, and exit 0.2 s later.
			command := `for i in 1 2 3 4 5; do sh -c 'sleep 0.2 & exit 0'; done; echo orphans made; sleep 3; exit 7`
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
			if tt.pidNS {
				h.attr = newPIDNamespace(t)
			}
			sv := h.start("--finish")
			h.waitLog("orphans made\n", 20*time.Second)
			pid := sv.cmd.Process.Pid
			// The orphans have exited after 0.2 s; the command sleeps on for 3 s.
			time.Sleep(500 * time.Millisecond)
			assert.Eventually(t, func() bool { return len(zombiesOf(pid)) == 0 }, 2*time.Second, 20*time.Millisecond,
				"the supervisor leaves zombies: %v", zombiesOf(pid))
			assert.Equal(t, 7, sv.wait(t, 30*time.Second), "the command's exit status is its own")
			snap := h.snapshot()
			assert.Equal(t, "7", snap.ExitStatus)
			assert.Equal(t, 7, h.readProgress().ExitStatus)
		})
	}
}

// TestCancelKillsBackgroundProcesses: on a cancel, SIGTERM goes to the command's whole
// process group, and so does SIGKILL after the grace period, even after the command itself
// has exited: a background process that ignores SIGTERM does not outlive the job.
func TestCancelKillsBackgroundProcesses(t *testing.T) {
	pidfile := filepath.Join(t.TempDir(), "background.pid")
	// The background process does not hold the output pipe, so the job's output ends with
	// the command, before the grace period.
	command := fmt.Sprintf(`sh -c 'trap "" TERM; echo $$ > %s; while :; do sleep 0.1; done' >/dev/null 2>&1 & echo ready; wait`, pidfile)
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
	sv := h.start("--finish")
	h.waitLog("ready\n", 20*time.Second)
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidfile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	}, 10*time.Second, 10*time.Millisecond)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	canceled := time.Now()
	require.NoError(t, h.s.CancelJob(h.job.ID))
	sv.wait(t, 30*time.Second)
	assert.Eventually(t, func() bool { return gone(pid) }, 2*time.Second, 20*time.Millisecond,
		"the background process that ignores SIGTERM outlived the job")
	assert.GreaterOrEqual(t, time.Since(canceled), time.Second, "SIGKILL comes after the grace period, not before")
	snap := h.snapshot()
	assert.Equal(t, "cancel", snap.SignalReason)
	assert.Equal(t, "SIGTERM", snap.Signal, "the command itself ended on SIGTERM")
}

// gone reports that pid has exited (a zombie counts: it runs no more).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}
