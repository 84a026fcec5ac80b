package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Result is one run of the bench: what `bench` prints as a table and writes as JSON.
type Result struct {
	Backend string `json:"backend"`
	// InFlight is the operator's slots: the most jobs it runs at once.
	InFlight int `json:"in_flight"`
	// Jobs is how many jobs the run created; Passed how many finished with exit status 0.
	Jobs    int       `json:"jobs"`
	Passed  int       `json:"passed"`
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	// Seconds is the measured window: from the first build's creation to the last finish.
	Seconds float64 `json:"seconds"`
	// JobsPerSecond is Jobs over Seconds: every job queued at once, N at a time.
	JobsPerSecond float64 `json:"jobs_per_second"`
	// Phases are the latencies of each step of a job, then the spans the targets name.
	Phases []Phase `json:"phases"`
	// BarePod is a bare pod's create → running with the same image, N at once: the floor.
	BarePod  Stats    `json:"bare_pod_create_to_running"`
	Requests Requests `json:"requests_per_job"`
	Agentd   Process  `json:"agentd"`
	// Controller is what the operator's own metrics say of its BuildJob controller.
	Controller Controller `json:"controller"`
}

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
	// CPUSecondsTotal is its CPU from start to exit (start-up and registration included).
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

// Print writes r as one Markdown table, with the bare-pod floor beside the latencies it
// bounds.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "%s backend, %d jobs in flight, %d jobs (%d passed) in %.1f s; %d CPUs, load %.1f before, %.1f after; %s\n\n",
		r.Backend, r.InFlight, r.Jobs, r.Passed, r.Seconds, r.Machine.CPUs, r.Machine.LoadBefore, r.Machine.LoadAfter, r.Machine.Commit)
	floor := fmt.Sprintf("%s (n=%d)", latency(r.BarePod), r.BarePod.Samples)
	rows := [][3]string{{"jobs per second, sustained", fmt.Sprintf("%.2f", r.JobsPerSecond), ""}}
	for _, p := range r.Phases {
		f := ""
		if p.Floor {
			f = floor
		}
		rows = append(rows, [3]string{p.Name, fmt.Sprintf("%s (n=%d)", latency(p.Stats), p.Samples), f})
	}
	rows = append(rows,
		[3]string{"API requests per job, all clients: all / writes", fmt.Sprintf("%.1f / %.1f", r.Requests.Total, r.Requests.Writes), ""},
		[3]string{"agentd writes per job (target ≤ 8)", fmt.Sprintf("%.1f", r.Requests.OperatorWrites), ""})
	for _, c := range r.Requests.ByClient {
		rows = append(rows, [3]string{"  " + c.Client + ": reads / writes per job", fmt.Sprintf("%.1f / %.1f", c.Reads, c.Writes), ""})
		for _, d := range r.Requests.Detail {
			// The rest are the components' own upkeep (leases, discovery), not the jobs'.
			if d.Client == c.Client && d.PerJob >= 0.1 {
				rows = append(rows, [3]string{"    " + d.Verb + " " + d.Resource, fmt.Sprintf("%.2f", d.PerJob), ""})
			}
		}
	}
	rows = append(rows,
		[3]string{"agentd peak RSS (VmHWM)", fmt.Sprintf("%.1f MiB", r.Agentd.PeakRSSMiB), ""},
		[3]string{"agentd at the end: goroutines, heap in use, stacks", fmt.Sprintf("%d, %.1f MiB, %.1f MiB", r.Agentd.Goroutines, r.Agentd.HeapInuseMiB, r.Agentd.StackInuseMiB), ""},
		[3]string{"agentd CPU per job", fmt.Sprintf("%.1f ms", r.Agentd.CPUSecondsPerJob*1000), ""},
		[3]string{"agentd CPU, whole run", fmt.Sprintf("%.1f s", r.Agentd.CPUSecondsTotal), ""},
		[3]string{"controller: reconciles per job, on how many workers", fmt.Sprintf("%.1f on %d", r.Controller.ReconcilesPerJob, r.Controller.Workers), ""},
		[3]string{"controller: mean reconcile / mean wait for a worker", fmt.Sprintf("%s / %s", ms(r.Controller.MeanReconcileMs), ms(r.Controller.MeanQueueWaitMs)), ""},
		[3]string{"controller: workers busy", fmt.Sprintf("%.0f%%", r.Controller.WorkersBusy*100), ""})

	fmt.Fprintln(w, "| measure | value | bare-pod floor, create → running |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, row := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row[:], " | "))
	}
}

// latency is "p50 / p95 / p99" in readable units.
func latency(s Stats) string {
	if s.Samples == 0 {
		return "no samples"
	}
	return fmt.Sprintf("%s / %s / %s", ms(s.P50), ms(s.P95), ms(s.P99))
}

func ms(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// DescribeMachine is this machine and checkout, for results of other runs (the soak).
func DescribeMachine() Machine { return machine() }
