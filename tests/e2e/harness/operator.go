package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster"
)

// Operator is `agentd operator` run as a real process, so that it can be killed with
// SIGKILL and started again as a crash and a restart would.
type Operator struct {
	Bin     string
	Args    []string
	Env     []string
	LogPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

// Start runs the operator, appending its output to LogPath.
func (o *Operator) Start() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd != nil {
		return errors.New("the operator is already running")
	}
	logf, err := os.OpenFile(o.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening the operator's log: %w", err)
	}
	o.starts++
	fmt.Fprintf(logf, "=== start %d at %s\n", o.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(o.Bin, append([]string{"operator"}, o.Args...)...)
	cmd.Env = append(os.Environ(), o.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C in the demo's terminal reaches the demo, which stops
	// the operator in order, rather than everything at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting %s operator: %w", o.Bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(done)
	}()
	o.cmd, o.done = cmd, done
	return nil
}

// Running reports whether the process is still alive.
func (o *Operator) Running() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd == nil {
		return false
	}
	select {
	case <-o.done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL and waits for the process to be gone: a crash.
func (o *Operator) Kill() error {
	return o.signal(syscall.SIGKILL, 10*time.Second)
}

// Stop asks the operator to stop (SIGTERM) and kills it after grace.
func (o *Operator) Stop(grace time.Duration) error {
	err := o.signal(syscall.SIGTERM, grace)
	if err != nil {
		if kerr := o.Kill(); kerr != nil {
			return errors.Join(err, kerr)
		}
	}
	return err
}

func (o *Operator) signal(sig syscall.Signal, wait time.Duration) error {
	o.mu.Lock()
	cmd, done := o.cmd, o.done
	o.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		o.mu.Lock()
		if o.cmd == cmd {
			o.cmd = nil
		}
		o.mu.Unlock()
		return nil
	case <-time.After(wait):
		return fmt.Errorf("the operator (pid %d) did not stop within %s of %s", cmd.Process.Pid, wait, sig)
	}
}

// LogHint is the operator's log file.
func (o *Operator) LogHint() string { return o.LogPath }

// Tail is the last n lines of the operator's log.
func (o *Operator) Tail(n int) string { return cluster.TailFile(o.LogPath, n) }
