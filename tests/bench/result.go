package bench

import (
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// Result is one run of the bench: what `bench` prints as a table and writes as JSON.
type Result struct {
	Backend string `json:"backend"`
	// Mode is ModeClosed (every job queued at once) or ModeOpen (jobs arrive at Rate).
	Mode string `json:"mode"`
	// Rate is the open loop's jobs per second: one job queued every 1/Rate seconds.
	Rate float64 `json:"rate,omitempty"`
	// Run counts the runs of one size and mode from 1 (the command sets it).
	Run int `json:"run,omitempty"`
	// Compare marks the runs of the throughput comparison (the command's -baseline-agentd):
	// CompareBaseline for the other commit's agentd, CompareThis for this one's, run in
	// turn. They are left out of every other figure.
	Compare string `json:"compare,omitempty"`
	// InFlight is the operator's slots: the most jobs it runs at once.
	InFlight int `json:"in_flight"`
	// Jobs is how many jobs the run created; Passed how many finished with exit status 0.
	Jobs    int       `json:"jobs"`
	Passed  int       `json:"passed"`
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	// Limits are the API server clients' rate limits in this run.
	Limits []ClientLimit `json:"client_limits"`
	// Seconds is the measured window: from the first job queued to the last finish.
	Seconds float64 `json:"seconds"`
	// JobsPerSecond is Jobs over Seconds: in the closed loop, the throughput with N in
	// flight; in the open loop, about Rate when the operator keeps up.
	JobsPerSecond float64 `json:"jobs_per_second"`
	// Phases are the latencies of each step of a job, then the spans the targets name.
	Phases []Phase `json:"phases"`
	// BarePod is a bare pod's create → running with the same image, N of them arriving as
	// the jobs do (at once, or at Rate): the floor.
	BarePod Stats `json:"bare_pod_create_to_running"`
	// MomentsFrom says where the moments of BuildJobs and pods come from.
	MomentsFrom string `json:"moments_from"`
	// PickupOverFloorMs is this run's pickup p50 minus its floor p50 (target ≤ 500 ms).
	PickupOverFloorMs float64  `json:"pickup_p50_over_floor_p50_ms"`
	Requests          Requests `json:"requests_per_job"`
	Agentd            Process  `json:"agentd"`
	// CPU is where the CPU went in the measured window, by process.
	CPU CPU `json:"cpu"`
	// Controller is what the operator's own metrics say of its BuildJob controller.
	Controller Controller `json:"controller"`
	// Samples are agentd's memory and the run's progress over the window.
	Samples []Sample `json:"samples"`
	// Warm is the warm-pool phase after the window (Config.Warm), in the same run.
	Warm *WarmResult `json:"warm,omitempty"`
}

// Where the moments of BuildJobs and pods come from.
const (
	momentsFromServer = "the API server: when it completed each write (audit log)"
	momentsFromWatch  = "the bench's watch: when it saw each change"
)

// The modes of a run.
const (
	ModeClosed = "closed loop"
	ModeOpen   = "open loop"
)

// Machine says where a run ran: the figures only mean something beside it.
type Machine struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"`
	Commit string `json:"commit"`
	// LoadBefore and LoadAfter are the 1-minute load averages: the machine is shared.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// Stats are the percentiles of one latency, in milliseconds (nearest rank).
type Stats struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P95     float64 `json:"p95_ms"`
	P99     float64 `json:"p99_ms"`
}

// Phase is one latency of a job, from one recorded moment to the next.
type Phase struct {
	Name string `json:"name"`
	Stats
	// Floor is set on the phases a bare pod's start bounds from below.
	Floor bool `json:"floor,omitempty"`
}

// Requests are the API server's requests per job in the measured window, from its audit log.
type Requests struct {
	Total float64 `json:"total"`
	// Writes are every client's creates, updates, patches and deletes.
	Writes float64 `json:"writes"`
	// OperatorWrites are agentd's creates, updates, patches and deletes: the target.
	OperatorWrites float64        `json:"operator_writes"`
	ByClient       []ClientCount  `json:"by_client"`
	Detail         []RequestCount `json:"detail"`
	Window         [2]time.Time   `json:"window"`
}

// ClientCount is one client's reads (get, list, watch) and writes per job.
type ClientCount struct {
	Client string  `json:"client"`
	Reads  float64 `json:"reads"`
	Writes float64 `json:"writes"`
}

// RequestCount is the requests per job of one client, verb and resource.
type RequestCount struct {
	Client   string  `json:"client"`
	Verb     string  `json:"verb"`
	Resource string  `json:"resource"`
	PerJob   float64 `json:"per_job"`
}

// Process is what agentd cost.
type Process struct {
	// PeakRSSMiB is VmHWM, read just before it was stopped.
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// CPUSecondsPerJob is its user and system CPU in the measured window, over Jobs.
	CPUSecondsPerJob float64 `json:"cpu_seconds_per_job"`
	// CPUSecondsTotal is its CPU from start to exit (start-up and registration included),
	// or to the window's end when the warm phase follows.
	CPUSecondsTotal float64 `json:"cpu_seconds_total"`
	// Goroutines, HeapInuseMiB and StackInuseMiB are from its Go runtime's metrics at the
	// end of the window: where the memory is.
	Goroutines    int     `json:"goroutines"`
	HeapInuseMiB  float64 `json:"heap_inuse_mib"`
	StackInuseMiB float64 `json:"stack_inuse_mib"`
}

// percentiles are the nearest-rank p50, p95 and p99 of ds.
func percentiles(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(s)))) - 1
		return float64(s[max(i, 0)]) / float64(time.Millisecond)
	}
	return Stats{Samples: len(s), P50: at(50), P95: at(95), P99: at(99)}
}

// DescribeMachine is this machine and checkout, for results of other runs (the soak).
func DescribeMachine() Machine { return machine() }

// machine describes this machine and checkout.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadBefore: loadAverage()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = testkit.RepoRoot()
	if b, err := cmd.Output(); err == nil {
		m.Commit = strings.TrimSpace(string(b))
	}
	return m
}

// loadAverage is the 1-minute load average (0 when unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
