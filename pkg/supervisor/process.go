package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drainIdle is how long, after a command has exited, its output pipe may stay silent before
// the supervisor stops reading it. Background processes the command left behind may hold the
// pipe open for ever; what they wrote before is kept, what they write later is not.
const drainIdle = 2 * time.Second

// process is one command run in its own process group, with stdout and stderr merged into one
// pipe, as a terminal would show them.
type process struct {
	cmd  *exec.Cmd
	pgid int

	exited chan struct{} // closed once the process has exited
	state  *os.ProcessState
	// copied is closed once the output has been read to its end (or given up, see drainIdle).
	copied chan struct{}
	// readingSince is when the reader started waiting in Read (unix nanos), 0 while it is
	// busy writing to the log (and perhaps held up by backpressure, which must not count as
	// silence).
	readingSince atomic.Int64
}

// startProcess starts name with args in dir, its output copied to out until it ends.
func startProcess(name string, args []string, dir string, env []string, out io.Writer) (*process, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("making a pipe for the command's output: %w", err)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdin = nil // /dev/null: a job has no terminal to read from
	cmd.Stdout = w
	cmd.Stderr = w
	// Its own process group, so that a cancel reaches everything the command started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, err
	}
	// Only the child holds the write end now: the reader sees EOF once it (and whatever it
	// started) are done.
	_ = w.Close()
	p := &process{cmd: cmd, pgid: cmd.Process.Pid, exited: make(chan struct{}), copied: make(chan struct{})}
	go p.copy(r, out)
	go func() {
		// Wait returns the error for a non-zero exit too; the state says everything.
		_ = cmd.Wait()
		p.state = cmd.ProcessState
		close(p.exited)
		p.drain(r)
	}()
	return p, nil
}

func (p *process) copy(r *os.File, out io.Writer) {
	defer close(p.copied)
	defer func() { _ = r.Close() }()
	buf := make([]byte, 64<<10)
	for {
		p.readingSince.Store(time.Now().UnixNano())
		n, err := r.Read(buf)
		p.readingSince.Store(0)
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				// The log is gone (aborted); keep reading so that the command is not blocked.
				out = io.Discard
			}
		}
		if err != nil {
			return
		}
	}
}

// drain waits, after the process exited, until the output is read to its end or the pipe
// has been silent for drainIdle, and then stops the reader.
func (p *process) drain(r *os.File) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.copied:
			return
		case <-t.C:
			since := p.readingSince.Load()
			if since != 0 && time.Since(time.Unix(0, since)) >= drainIdle {
				_ = r.SetReadDeadline(time.Now())
				<-p.copied
				return
			}
		}
	}
}

// signal sends sig to the process group.
func (p *process) signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil // nothing left to signal
	}
	return err
}

// wait waits for the process to exit and its output to be read.
func (p *process) wait() *os.ProcessState {
	<-p.exited
	<-p.copied
	return p.state
}

// exitOf turns a process state into Buildkite's terms: the exit status, or -1 and the
// signal's name when a signal killed it.
func exitOf(st *os.ProcessState) (status int, signal string) {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, unix.SignalName(ws.Signal())
	}
	return st.ExitCode(), ""
}

// containerExitCode is what the supervisor exits with: the command's exit code, or 128 plus
// the signal number when a signal killed it, as a shell reports it.
func containerExitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}
