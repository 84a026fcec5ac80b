package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster"
)

// child is a process the bench started (agentd, kwok, kube-scheduler), its output in a
// log file.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startChild runs bin with args and env added to the bench's, its output going to
// dir/<name>.log.
func startChild(name, dir, bin string, args, env []string) (*child, error) {
	path := filepath.Join(dir, name+".log")
	logf, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating %s's log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C reaches the bench, which stops its children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	c := &child{name: name, cmd: cmd, log: path, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(c.done)
	}()
	return c, nil
}

func (c *child) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// tail is the end of the child's log, for errors.
func (c *child) tail() string { return cluster.TailFile(c.log, 30) }

// stop sends SIGTERM, and SIGKILL after grace, and waits for the process to be gone.
func (c *child) stop(grace time.Duration) error {
	if !c.running() {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(grace):
	}
	_ = c.cmd.Process.Kill()
	<-c.done
	return fmt.Errorf("%s did not stop within %s of SIGTERM: killed", c.name, grace)
}

// rusage is the child's resource use, once it has exited.
func (c *child) rusage() *syscall.Rusage {
	if c.cmd.ProcessState == nil {
		return nil
	}
	ru, _ := c.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return ru
}

// clockTick is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on Linux.
const clockTick = 10 * time.Millisecond

// cpuTime is the user and system CPU the running child has used so far.
func (c *child) cpuTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("reading %s's CPU time: %w", c.name, err)
	}
	// The command name, in parentheses, may hold spaces: fields are counted after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("reading %s's CPU time: unexpected /proc stat %q", c.name, s)
	}
	fields := strings.Fields(s[i+1:])
	// utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
	if len(fields) < 13 {
		return 0, fmt.Errorf("reading %s's CPU time: short /proc stat %q", c.name, s)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("reading %s's CPU time: %w", c.name, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// peakRSS is the running child's VmHWM, in bytes.
func (c *child) peakRSS() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("reading %s's peak RSS: %w", c.name, err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("reading %s's peak RSS from %q: %w", c.name, v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/<pid>/status")
}
