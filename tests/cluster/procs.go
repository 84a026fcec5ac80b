package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// startTime reads a process's start time (clock ticks since boot) from /proc, which with
// the pid identifies it: a pid reused by another program has a different start time.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	// The command name (field 2) may hold spaces and parentheses: skip past its last ')'.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); the start time is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// alive says whether the recorded process still runs (and is not a zombie).
func (p procRecord) alive() bool {
	st, err := startTime(p.Pid)
	if err != nil || st != p.Start {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// startProcess starts a long-running component in its own session (so it outlives a
// `localnode up` that exits), with output to logs/<name>.log.
func (c *Cluster) startProcess(name string, bin string, args []string, env []string) (*exec.Cmd, error) {
	logPath := filepath.Join(c.logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", logPath, err)
	}
	defer func() { _ = logFile.Close() }()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	st, err := startTime(cmd.Process.Pid)
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("reading the start time of %s: %w", name, err)
	}
	c.j.Processes = append(c.j.Processes, procRecord{Name: name, Pid: cmd.Process.Pid, Start: st})
	if err := c.j.save(); err != nil {
		_ = cmd.Process.Kill()
		return nil, err
	}
	exited := make(chan struct{})
	c.exited[name] = exited
	// Reap it while this process lives; after a CLI exits, init reaps it.
	go func() { _ = cmd.Wait(); close(exited) }()
	c.logf("started %s (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return cmd, nil
}

// stopProcess sends SIGTERM, waits up to grace, then SIGKILL. It signals only the exact
// process it started.
func stopProcess(p procRecord, grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	if err := syscall.Kill(p.Pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping %s (pid %d): %w", p.Name, p.Pid, err)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.alive() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if p.alive() {
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	}
	for i := 0; i < 100 && p.alive(); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if p.alive() {
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.Pid)
	}
	return nil
}

// shimsOf lists containerd shims serving the given containerd socket: they were started by
// the node's containerd, and outlive it by design.
func shimsOf(socket string) []procRecord {
	var out []procRecord
	for _, pid := range pids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == socket {
				if st, err := startTime(pid); err == nil {
					out = append(out, procRecord{Name: "containerd-shim", Pid: pid, Start: st})
				}
				break
			}
		}
	}
	return out
}

// processesNamed lists running (not zombie) processes whose command name is name.
func processesNamed(name string) []int {
	var out []int
	for _, pid := range pids() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		if st, err := startTime(pid); err == nil && (procRecord{Pid: pid, Start: st}).alive() {
			out = append(out, pid)
		}
	}
	return out
}

// pids lists the processes of the host, as /proc has them now.
func pids() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
