package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// outputAfterExit is how long, once a process has exited, the supervisor goes on waiting for
// the end of its output: background processes it left behind may hold the output pipe open,
// and print, for ever, and must not keep the job open. The agent gives up on the copy of a
// process's output 10 s after the process has ended (internal/process, the PTY copy), and
// so does the supervisor. Time spent waiting for the log to take what was read
// (backpressure, a slow Buildkite) does not count: what the process wrote before it exited
// is always kept. A variable so that in-process tests can shorten it.
var outputAfterExit = 10 * time.Second

// outputPipeBytes is the size the supervisor asks for the command's output pipe, and
// outputReadBytes how much it reads from it at once. Linux's default pipe holds 64 KiB: a
// command printing fast (cat writes 128 KiB at a time) then blocks, and the reader wakes, at
// every 64 KiB, and each wake-up costs both of them CPU. A 1 MiB pipe (the most
// /proc/sys/fs/pipe-max-size allows by default) lets the command write ahead while the
// reader works, and reads of up to 256 KiB take what has piled up in a quarter of the
// calls (in profiled runs, reads of 1 MiB were no cheaper, nor was a 256 KiB pipe). A
// read returns as soon as there is output, so a command printing slowly sees no
// difference, and its lines are stamped as they come. The pipe's pages are the kernel's
// (not in the supervisor's RSS), and only a command that prints faster than the log is
// sent fills them.
const (
	outputPipeBytes = 1 << 20
	outputReadBytes = 256 << 10
)

// process is one command run in its own process group, with stdout and stderr merged into one
// pipe, as a terminal would show them.
type process struct {
	cmd  *exec.Cmd
	pgid int

	exited chan struct{} // closed once the process has exited
	status syscall.WaitStatus
	// copied is closed once the output has been read to its end (or given up, see
	// outputAfterExit).
	copied chan struct{}
	// exitedAt is when the process exited (unix nanos), 0 before.
	exitedAt atomic.Int64
	// readingSince is when the reader started waiting in Read (unix nanos), 0 while it is
	// busy writing to the log (and perhaps held up by backpressure, which must not count
	// against outputAfterExit).
	readingSince atomic.Int64
	// waited is how long the reader has waited in Read since the process exited (nanos),
	// over the reads that have returned.
	waited atomic.Int64
	// afterExit is outputAfterExit when the process started.
	afterExit time.Duration
	// cutOff is set when the reader stopped at afterExit, before the end of the output:
	// processes the command left behind still held the pipe.
	cutOff atomic.Bool
}

// startProcess starts name with args in dir, its output copied to out until it ends.
func startProcess(name string, args []string, dir string, env []string, out io.Writer) (*process, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("making a pipe for the command's output: %w", err)
	}
	growPipe(r, outputPipeBytes)
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdin = nil // /dev/null: a job has no terminal to read from
	cmd.Stdout = w
	cmd.Stderr = w
	// Its own process group, so that a cancel reaches everything the command started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	reaped, err := startChild(cmd)
	if err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, err
	}
	// Only the child holds the write end now: the reader sees EOF once it (and whatever it
	// started) are done.
	_ = w.Close()
	p := &process{cmd: cmd, pgid: cmd.Process.Pid, exited: make(chan struct{}), copied: make(chan struct{}), afterExit: outputAfterExit}
	go p.copy(r, out)
	go func() {
		if reaped != nil {
			p.status = <-reaped
			_ = cmd.Process.Release()
		} else {
			// Wait returns the error for a non-zero exit too; the status says everything.
			_ = cmd.Wait()
			p.status, _ = cmd.ProcessState.Sys().(syscall.WaitStatus)
		}
		p.exitedAt.Store(time.Now().UnixNano())
		close(p.exited)
		p.drain(r)
	}()
	return p, nil
}

// reaper reaps every child of the supervisor, as PID 1 of a container must: processes the
// job leaves behind are adopted by PID 1 (or by the nearest subreaper), and stay zombies
// until it waits for them. Waiting for any child (wait4(-1)) would take the exit status of
// the processes the supervisor started too, so the reaper hands those to their waiters.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus // (mu)
	orphans atomic.Int64                    // orphans reaped, for tests and diagnostics
}

var (
	reaperOnce   sync.Once
	activeReaper atomic.Pointer[reaper]
)

// startReaper makes the process reap all its children from now on, and adopt the orphans
// of its descendants even where it is not PID 1 (a pod sharing its process namespace, a
// standalone run). Only a process of its own may do this: it takes every child's exit
// status, so Main does it, never a library caller; and every child the supervisor starts
// must be started by startChild, since cmd.Wait on any other would find its status taken.
func startReaper(logf func(string, ...any)) {
	reaperOnce.Do(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			logf("becoming a subreaper: %v (orphans of the job go to PID 1)", err)
		}
		r := &reaper{waiting: map[int]chan syscall.WaitStatus{}}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGCHLD)
		activeReaper.Store(r)
		go func() {
			for range sigs {
				r.reapAll()
			}
		}()
		r.reapAll() // children that ended before SIGCHLD was watched
	})
}

// startChild starts cmd; with the reaper running, it returns the channel its exit status
// arrives on, and cmd must not be waited for.
func startChild(cmd *exec.Cmd) (<-chan syscall.WaitStatus, error) {
	r := activeReaper.Load()
	if r == nil {
		return nil, cmd.Start()
	}
	// Held while the child is registered: the reaper may reap it before that, but hands its
	// status over only after.
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[cmd.Process.Pid] = ch
	return ch, nil
}

// reapAll waits for every child that has exited.
func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return // no child, or none has exited
		}
		r.mu.Lock()
		ch, ours := r.waiting[pid]
		delete(r.waiting, pid)
		r.mu.Unlock()
		if ours {
			ch <- ws
		} else {
			r.orphans.Add(1)
		}
	}
}

func (p *process) copy(r *os.File, out io.Writer) {
	defer close(p.copied)
	defer func() { _ = r.Close() }()
	buf := make([]byte, outputReadBytes)
	for {
		start := time.Now().UnixNano()
		p.readingSince.Store(start)
		n, err := r.Read(buf)
		p.readingSince.Store(0)
		p.waited.Add(p.waitedAfterExit(start, time.Now().UnixNano()))
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

// growPipe asks for the pipe r reads to hold size bytes, and returns what it holds. It is
// only a saving: where the kernel refuses (a user past /proc/sys/fs/pipe-user-pages-soft,
// a pipe-max-size set lower), the pipe keeps its size and the output flows all the same.
func growPipe(r *os.File, size int) int {
	// Through SyscallConn, not Fd: Fd would turn the pipe to blocking mode, taking its reads
	// off the runtime's poller.
	rc, err := r.SyscallConn()
	if err != nil {
		return 0
	}
	got := 0
	_ = rc.Control(func(fd uintptr) {
		if _, err := unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size); err != nil {
			return
		}
		got, _ = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0)
	})
	return got
}

// drain waits, after the process exited, until the output is read to its end or the reader
// has waited afterExit for more of it, and then stops the reader.
func (p *process) drain(r *os.File) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.copied:
			return
		case <-t.C:
			waited := time.Duration(p.waited.Load())
			if since := p.readingSince.Load(); since != 0 {
				waited += time.Duration(p.waitedAfterExit(since, time.Now().UnixNano()))
			}
			if waited >= p.afterExit {
				p.cutOff.Store(true)
				_ = r.SetReadDeadline(time.Now())
				<-p.copied
				return
			}
		}
	}
}

// waitedAfterExit is the part of a wait in Read, from..to (unix nanos), after the process
// exited.
func (p *process) waitedAfterExit(from, to int64) int64 {
	exited := p.exitedAt.Load()
	if exited == 0 {
		return 0
	}
	return max(0, to-max(from, exited))
}

// awaitGroup waits, once the process has been told to stop, until nothing is left of its
// process group, or until killed is closed (the SIGKILL at the end of the grace period).
// The group is looked at again and again, not once: something the command started may
// take a moment to exit on SIGTERM (or be a zombie the reaper has not reaped yet), and the
// job must then end when it does, not at the end of the grace period.
func (p *process) awaitGroup(killed <-chan struct{}) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for p.groupAlive() {
		select {
		case <-killed:
			return
		case <-t.C:
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

// groupAlive reports that some process of the group is still there.
func (p *process) groupAlive() bool {
	return syscall.Kill(-p.pgid, 0) == nil
}

// wait waits for the process to exit and its output to be read.
func (p *process) wait() syscall.WaitStatus {
	<-p.exited
	<-p.copied
	return p.status
}

// succeeded reports an exit with status 0. Call after wait.
func (p *process) succeeded() bool {
	return p.status.Exited() && p.status.ExitStatus() == 0
}

// exitOf turns a wait status into Buildkite's terms: the exit status, or -1 and the
// signal's name when a signal killed it.
func exitOf(ws syscall.WaitStatus) (status int, signal string) {
	if ws.Signaled() {
		return -1, unix.SignalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}

// containerExitCode is what the supervisor exits with: the command's exit code, or 128 plus
// the signal number when a signal killed it, as a shell reports it.
func containerExitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
