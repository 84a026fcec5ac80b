package bench

import (
	"bufio"
	"fmt"
	"io"
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

func (c *child) pid() int { return c.cmd.Process.Pid }

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

// peakRSS is the running child's VmHWM, in bytes.
func (c *child) peakRSS() (int64, error) { return statusBytes(c.pid(), "VmHWM") }

// rss is the running child's VmRSS, in bytes.
func (c *child) rss() (int64, error) { return statusBytes(c.pid(), "VmRSS") }

// clockTick is the unit of /proc's CPU times: USER_HZ, 100 on Linux.
const clockTick = 10 * time.Millisecond

// procStat is what the bench reads of /proc/<pid>/stat.
type procStat struct {
	// comm is the command name, at most 15 bytes of the executable's name.
	comm string
	ppid int
	// cpu is user and system time, the process's own (children it waited for excluded).
	cpu time.Duration
}

// readStat reads /proc/<pid>/stat.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	st, err := parseStat(string(b))
	if err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// parseStat reads a /proc/<pid>/stat line: "pid (comm) state ppid … utime stime …".
func parseStat(s string) (procStat, error) {
	// The command name, in parentheses, may hold spaces and parentheses: fields are
	// counted after its last ')'.
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("no command name in %q", s)
	}
	fields := strings.Fields(s[end+1:])
	// After the name: state (field 3 of the line), ppid (4), …, utime (14), stime (15).
	if len(fields) < 13 {
		return procStat{}, fmt.Errorf("short line %q", s)
	}
	var n [3]int64
	for i, f := range []string{fields[1], fields[11], fields[12]} {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("field %q of %q: %w", f, s, err)
		}
		n[i] = v
	}
	return procStat{comm: s[open+1 : end], ppid: int(n[0]), cpu: time.Duration(n[1]+n[2]) * clockTick}, nil
}

// statusBytes is a "kB" field of /proc/<pid>/status (VmRSS, VmHWM), in bytes.
func statusBytes(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading %s of process %d: %w", field, pid, err)
	}
	defer func() { _ = f.Close() }()
	v, err := parseStatusKB(f, field)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return v, nil
}

// parseStatusKB finds "field:   123 kB" in a /proc/<pid>/status and returns it in bytes.
func parseStatusKB(r io.Reader, field string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), field+":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q: %w", field, v, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s", field)
}

// descendants are the processes under root (its children, theirs, and so on), by pid:
// envtest's kube-apiserver and etcd are the bench's children, as are the processes it
// starts itself.
func descendants(root int) (map[int]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	all := map[int]procStat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A process may end between the listing and the read: it is no longer there to count.
		if st, err := readStat(pid); err == nil {
			all[pid] = st
		}
	}
	return underRoot(all, root), nil
}

// underRoot keeps the processes of all below root.
func underRoot(all map[int]procStat, root int) map[int]procStat {
	children := map[int][]int{}
	for pid, st := range all {
		children[st.ppid] = append(children[st.ppid], pid)
	}
	out := map[int]procStat{}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if _, seen := out[c]; !seen && c != root {
				out[c] = all[c]
				queue = append(queue, c)
			}
		}
	}
	return out
}

// machineBusy is the CPU time all of the machine's CPUs have spent on anything but
// waiting since boot: user, nice, system, irq and softirq from /proc/stat (steal, the
// hypervisor's, is not this machine's work; guest time is already in user).
func machineBusy() (time.Duration, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("reading the machine's CPU time: %w", err)
	}
	defer func() { _ = f.Close() }()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("reading /proc/stat: %w", err)
	}
	return parseCPULine(line)
}

// parseCPULine reads /proc/stat's first line: "cpu user nice system idle iowait irq softirq steal …".
func parseCPULine(line string) (time.Duration, error) {
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat field %q: %w", fields[i], err)
		}
		ticks += v
	}
	return time.Duration(ticks) * clockTick, nil
}
