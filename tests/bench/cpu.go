package bench

import (
	"os"
	"slices"
	"strings"
	"time"
)

// CPU is where the CPU went in the measured window, measured from /proc: each process
// of the run, the bench's own, and the rest of the machine.
type CPU struct {
	// Processes are the bench process and every process under it, grouped by name, the
	// most CPU first.
	Processes []ProcessCPU `json:"processes"`
	// RunSeconds is the CPU all of them used.
	RunSeconds float64 `json:"run_seconds"`
	// MachineSeconds is the CPU the whole machine used (/proc/stat): beside RunSeconds,
	// what else ran on it.
	MachineSeconds float64 `json:"machine_seconds"`
	// WindowSeconds is the wall time over which both were measured.
	WindowSeconds float64 `json:"window_seconds"`
}

// ProcessCPU is one program's CPU in the window: user and system time from
// /proc/<pid>/stat, the difference between the window's ends.
type ProcessCPU struct {
	Name          string  `json:"name"`
	Seconds       float64 `json:"seconds"`
	SecondsPerJob float64 `json:"seconds_per_job"`
}

// benchProcess names the bench's own process: the fake Buildkite, the stand-in
// supervisor and the watch run in it, so their CPU is one figure.
const benchProcess = "bench (+ fake Buildkite, stand-in, watch)"

// cpuSnapshot is the CPU used so far by the bench process, each process under it, and
// the machine.
type cpuSnapshot struct {
	at      time.Time
	self    time.Duration
	procs   map[int]procStat
	machine time.Duration
}

// takeCPU reads the CPU times now.
func takeCPU() (cpuSnapshot, error) {
	s := cpuSnapshot{at: time.Now()}
	self, err := readStat(os.Getpid())
	if err != nil {
		return s, err
	}
	s.self = self.cpu
	if s.procs, err = descendants(os.Getpid()); err != nil {
		return s, err
	}
	if s.machine, err = machineBusy(); err != nil {
		return s, err
	}
	return s, nil
}

// processName groups processes by program: kwok's binary carries its version, and the
// kernel keeps 15 bytes of a program's name.
func processName(comm string) string {
	switch {
	case strings.HasPrefix(comm, "kwok"):
		return "kwok"
	case comm == "kube-controller":
		return "kube-controller-manager"
	}
	return comm
}

// cpuBetween is the CPU used from a to b, over jobs. A process that was not there at a
// started in the window: all of its CPU counts. One that ended before b is not counted:
// the kwok backend's processes all outlive the window.
func cpuBetween(a, b cpuSnapshot, jobs int) CPU {
	byName := map[string]time.Duration{benchProcess: b.self - a.self}
	for pid, st := range b.procs {
		used := st.cpu
		if before, ok := a.procs[pid]; ok && before.comm == st.comm {
			used -= before.cpu
		}
		byName[processName(st.comm)] += used
	}
	out := CPU{MachineSeconds: (b.machine - a.machine).Seconds(), WindowSeconds: b.at.Sub(a.at).Seconds()}
	for name, d := range byName {
		p := ProcessCPU{Name: name, Seconds: d.Seconds()}
		if jobs > 0 {
			p.SecondsPerJob = p.Seconds / float64(jobs)
		}
		out.Processes = append(out.Processes, p)
		out.RunSeconds += p.Seconds
	}
	slices.SortFunc(out.Processes, func(x, y ProcessCPU) int { return cmpDesc(x.Seconds, y.Seconds, x.Name, y.Name) })
	return out
}

// seconds is the CPU of the process named name (0 when there was none).
func (c CPU) seconds(name string) float64 {
	for _, p := range c.Processes {
		if p.Name == name {
			return p.Seconds
		}
	}
	return 0
}
