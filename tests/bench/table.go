package bench

import (
	"fmt"
	"io"
	"strings"
)

// Print writes r as a Markdown table.
func (r *Result) Print(w io.Writer) { PrintRuns(w, []*Result{r}) }

// PrintRuns writes runs of one size and mode as one Markdown table: with several runs,
// each figure's min, median and max across them; the bare-pod floor is measured in each.
func PrintRuns(w io.Writer, runs []*Result) {
	if len(runs) == 0 {
		return
	}
	printHeader(w, runs)
	var rows []row
	rows = append(rows, latencyRows(runs)...)
	rows = append(rows, requestRows(runs)...)
	rows = append(rows, cpuRows(runs)...)
	rows = append(rows, agentdRows()...)
	if len(runs) == 1 {
		fmt.Fprintln(w, "| measure | value |")
		fmt.Fprintln(w, "|---|---|")
	} else {
		fmt.Fprintln(w, "| measure | min | median | max |")
		fmt.Fprintln(w, "|---|---|---|---|")
	}
	for _, rw := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", rw.name, strings.Join(rw.cells(runs), " | "))
	}
}

func printHeader(w io.Writer, runs []*Result) {
	first := runs[0]
	mode := fmt.Sprintf("%s: every job queued at once", ModeClosed)
	if first.Mode == ModeOpen {
		mode = fmt.Sprintf("%s: one job every %s (%.2f a second)", ModeOpen, ms(1000/first.Rate), first.Rate)
	}
	passed, jobs := 0, 0
	loads := make([]float64, 0, 2*len(runs))
	for _, r := range runs {
		passed, jobs = passed+r.Passed, jobs+r.Jobs
		loads = append(loads, r.Machine.LoadBefore, r.Machine.LoadAfter)
	}
	load := newSpread(loads)
	fmt.Fprintf(w, "%s backend, %s; %d in flight, %d jobs a run, %d run(s): %d of %d jobs passed\n",
		first.Backend, mode, first.InFlight, first.Jobs, len(runs), passed, jobs)
	fmt.Fprintf(w, "machine: %d CPUs, load average %.1f to %.1f before and after the runs; %s\n",
		first.Machine.CPUs, load.min, load.max, first.Machine.Commit)
	limits := make([]string, 0, len(first.Limits))
	for _, l := range first.Limits {
		limits = append(limits, l.String())
	}
	fmt.Fprintf(w, "API clients' limits, QPS / burst: %s\n", strings.Join(limits, "; "))
	fmt.Fprintf(w, "BuildJob and pod moments, the floor's too: %s\n", first.MomentsFrom)
	if first.Backend == BackendKwok {
		fmt.Fprintln(w, "kwok: no container runs; the rows that say so time the bench's stand-in supervisor, not the product's")
	}
	if first.Warm != nil {
		fmt.Fprint(w, "warm pool: agentd serves its webhook server (the hand-off endpoint) in both phases, and no webhook configuration names it; ")
		if first.Backend == BackendNode {
			fmt.Fprintf(w, "each warm pod's own supervisor fetches its job from that endpoint through Service %s to this host, with its projected token, and agentd checks the pod's address; the hand-off's moment is agentd's log line\n", nodeWebhookService)
		} else {
			fmt.Fprintln(w, "the stand-in fetches each warm pod's job from that endpoint with a token minted for the pod")
		}
	}
	if len(runs) > 1 {
		fmt.Fprintln(w, "min / median / max across the runs, each figure on its own; latencies are p50 / p95 / p99")
	} else {
		fmt.Fprintln(w, "latencies are p50 / p95 / p99")
	}
	fmt.Fprintln(w)
}

// latencyRows are the throughput, each phase, and the floor beside what it bounds.
func latencyRows(runs []*Result) []row {
	rows := []row{{name: "jobs per second over the window", values: one(func(r *Result) float64 { return r.JobsPerSecond }), format: fixed(2)}}
	floorName := "**floor**: a bare pod's create → running, N at once, same run"
	if runs[0].Mode == ModeOpen {
		floorName = "**floor**: a bare pod's create → running, N arriving at the same rate, same run"
	}
	floor := row{
		name:   floorName,
		values: func(r *Result) []float64 { return p50p95p99(r.BarePod) }, format: ms,
	}
	for i, p := range runs[0].Phases {
		name := p.Name
		if n := minSamples(runs, i); n != runs[0].Jobs {
			name += fmt.Sprintf(" (samples: %d)", n)
		}
		rows = append(rows, row{name: name, values: func(r *Result) []float64 {
			if i >= len(r.Phases) {
				return nil
			}
			return p50p95p99(r.Phases[i].Stats)
		}, format: ms})
		switch {
		case p.Name == pickupPhase:
			rows = append(rows, row{
				name:   "pickup p50 − floor p50, each run (target ≤ 500 ms)",
				values: one(func(r *Result) float64 { return r.PickupOverFloorMs }), format: ms,
			})
			rows = append(rows, warmRows(runs)...)
		case p.Floor:
			rows = append(rows, floor)
		}
	}
	return rows
}

// warmRows are the warm-pool phase's, beside the cold pickup and the floor of the same runs.
func warmRows(runs []*Result) []row {
	var first *WarmResult
	for _, r := range runs {
		if r.Warm != nil {
			first = r.Warm
			break
		}
	}
	if first == nil {
		return nil
	}
	rows := []row{{
		name: fmt.Sprintf("**warm pool** of %d after the jobs above, %d round(s) of %d jobs at once: jobs started in a warm pod / jobs",
			first.PoolSize, first.Rounds, runs[0].InFlight),
		values: func(r *Result) []float64 {
			if r.Warm == nil {
				return nil
			}
			return []float64{float64(r.Warm.Warm), float64(r.Warm.Jobs)}
		},
		format: fixed(0),
	}}
	for i, p := range first.Phases {
		name := "  warm: " + p.Name
		if isWarmPickup(p.Name) {
			name = "**warm pickup**: " + p.Name
		}
		if n := minWarmSamples(runs, i); n != first.Jobs {
			name += fmt.Sprintf(" (samples: %d)", n)
		}
		rows = append(rows, row{name: name, values: func(r *Result) []float64 {
			if r.Warm == nil || i >= len(r.Warm.Phases) {
				return nil
			}
			return p50p95p99(r.Warm.Phases[i].Stats)
		}, format: ms})
	}
	return append(rows, row{
		name: "  warm: agentd writes per job (its pool's replacement pod included)",
		values: func(r *Result) []float64 {
			if r.Warm == nil {
				return nil
			}
			return []float64{r.Warm.Requests.OperatorWrites}
		},
		format: fixed(1),
	})
}

func minWarmSamples(runs []*Result, phase int) int {
	n := -1
	for _, r := range runs {
		if r.Warm != nil && phase < len(r.Warm.Phases) && (n < 0 || r.Warm.Phases[phase].Samples < n) {
			n = r.Warm.Phases[phase].Samples
		}
	}
	return n
}

func minSamples(runs []*Result, phase int) int {
	n := -1
	for _, r := range runs {
		if phase < len(r.Phases) && (n < 0 || r.Phases[phase].Samples < n) {
			n = r.Phases[phase].Samples
		}
	}
	return n
}

// requestRows are the API server's requests per job, by client and in detail.
func requestRows(runs []*Result) []row {
	rows := []row{
		{name: "API requests per job, all clients: all / writes", values: func(r *Result) []float64 {
			return []float64{r.Requests.Total, r.Requests.Writes}
		}, format: fixed(1)},
		{name: "agentd writes per job (target ≤ 8)", values: one(func(r *Result) float64 { return r.Requests.OperatorWrites }), format: fixed(1)},
	}
	clients := names(runs, func(r *Result) []string {
		var out []string
		for _, c := range r.Requests.ByClient {
			out = append(out, c.Client)
		}
		return out
	})
	for _, c := range clients {
		rows = append(rows, row{name: "  " + c + ": reads / writes per job", values: func(r *Result) []float64 {
			for _, cc := range r.Requests.ByClient {
				if cc.Client == c {
					return []float64{cc.Reads, cc.Writes}
				}
			}
			return []float64{0, 0}
		}, format: fixed(1)})
		for _, d := range requestDetail(runs, c) {
			rows = append(rows, row{name: "    " + d.Verb + " " + d.Resource, values: one(func(r *Result) float64 {
				for _, x := range r.Requests.Detail {
					if x.Client == c && x.Verb == d.Verb && x.Resource == d.Resource {
						return x.PerJob
					}
				}
				return 0
			}), format: fixed(2)})
		}
	}
	return rows
}

// requestDetail are client's verbs and resources with at least 0.1 request per job in
// some run: the rest are the components' own upkeep (leases, discovery), not the jobs'.
func requestDetail(runs []*Result, client string) []RequestCount {
	var out []RequestCount
	for _, r := range runs {
		for _, d := range r.Requests.Detail {
			if d.Client != client || d.PerJob < 0.1 {
				continue
			}
			known := false
			for _, o := range out {
				known = known || (o.Verb == d.Verb && o.Resource == d.Resource)
			}
			if !known {
				out = append(out, d)
			}
		}
	}
	return out
}

// cpuRows are the CPU per job of each process, of them all, and of the rest of the machine.
func cpuRows(runs []*Result) []row {
	perJob := func(seconds float64, r *Result) float64 { return seconds * 1000 / float64(max(r.Jobs, 1)) }
	cpuMs := func(v float64) string { return fmt.Sprintf("%.1f ms", v) }
	rows := []row{{name: "CPU per job, every process of the run (/proc, user + system)", values: one(func(r *Result) float64 {
		return perJob(r.CPU.RunSeconds, r)
	}), format: cpuMs}}
	for _, name := range names(runs, func(r *Result) []string {
		var out []string
		for _, p := range r.CPU.Processes {
			out = append(out, p.Name)
		}
		return out
	}) {
		rows = append(rows, row{name: "  " + name, values: one(func(r *Result) float64 {
			return perJob(r.CPU.seconds(name), r)
		}), format: cpuMs})
	}
	return append(rows,
		row{name: "CPU per job, the rest of the machine (others' work on it)", values: one(func(r *Result) float64 {
			return perJob(r.CPU.MachineSeconds-r.CPU.RunSeconds, r)
		}), format: cpuMs},
		row{name: "the machine's CPUs busy over the window", values: one(func(r *Result) float64 {
			if r.CPU.WindowSeconds <= 0 {
				return 0
			}
			return r.CPU.MachineSeconds / (r.CPU.WindowSeconds * float64(r.Machine.CPUs))
		}), format: percent},
	)
}

// agentdRows are agentd's memory and its controller's figures.
func agentdRows() []row {
	return []row{
		{name: "agentd peak RSS (VmHWM)", values: one(func(r *Result) float64 { return r.Agentd.PeakRSSMiB }), format: mib},
		{name: "agentd at the end: goroutines", values: one(func(r *Result) float64 { return float64(r.Agentd.Goroutines) }), format: fixed(0)},
		{name: "agentd at the end: heap in use / stacks", values: func(r *Result) []float64 {
			return []float64{r.Agentd.HeapInuseMiB, r.Agentd.StackInuseMiB}
		}, format: mib},
		{name: "agentd CPU, whole run (start-up included)", values: one(func(r *Result) float64 { return r.Agentd.CPUSecondsTotal }), format: func(v float64) string { return fmt.Sprintf("%.1f s", v) }},
		{name: "controller: workers", values: one(func(r *Result) float64 { return float64(r.Controller.Workers) }), format: fixed(0)},
		{name: "controller: reconciles per job", values: one(func(r *Result) float64 { return r.Controller.ReconcilesPerJob }), format: fixed(1)},
		{name: "controller: mean reconcile / mean wait for a worker", values: func(r *Result) []float64 {
			return []float64{r.Controller.MeanReconcileMs, r.Controller.MeanQueueWaitMs}
		}, format: ms},
		{name: "controller: workers busy", values: one(func(r *Result) float64 { return r.Controller.WorkersBusy }), format: percent},
	}
}
