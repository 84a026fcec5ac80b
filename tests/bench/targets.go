package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/dispatchbench"
)

// ModeTargets is the issue 27 targets table's entry in the JSON.
const ModeTargets = "issue 27 targets"

// Target statuses.
const (
	StatusMet         = "met"
	StatusMissed      = "missed"
	StatusNotMeasured = "not measured"
	// StatusNotJudged is a figure measured whose target this run cannot judge alone.
	StatusNotJudged = "not judged"
)

// buildJobRetention is how long the operator keeps a reported BuildJob by default, and
// maxRetainedBuildJobs how many at most (buildjob.DefaultBuildJobRetention and
// DefaultMaxRetainedBuildJobs, which a test keeps them equal to): agentd's memory can only
// be flat once the first BuildJobs are reaped, after the retention or once the cap is
// reached, whichever comes first.
const (
	buildJobRetention    = time.Hour
	maxRetainedBuildJobs = 5000
)

// firstReap is when the first reported BuildJobs go in a run at rate jobs a second: at the
// end of the retention, or once the cap is reached, if sooner.
func firstReap(rate float64) time.Duration {
	if rate <= 0 {
		return buildJobRetention
	}
	return min(buildJobRetention, time.Duration(maxRetainedBuildJobs/rate*float64(time.Second)))
}

// flatGrowth is the most agentd's RSS may grow over the retention run's last quarter, as
// a share of its RSS at the end, for "flat".
const flatGrowth = 0.05

// The issue's targets (issue 27, "Targets").
const (
	targetDispatchP99Ms    = 1000  // streaming dispatch → accepted p99 < 1 s
	targetNodeOneOverMs    = 500   // node, one at a time: pickup within 0.5 s of the floor
	targetNodeTenOverMs    = 1500  // node, 10 in flight: within 1.5 s
	targetKwokTenOverMs    = 150   // kwok, 10 in flight: within 150 ms (median of 3)
	targetKwokWarmMs       = 100   // issue 28: kwok, 10 in flight, a warm pool as large as the load: p50 ≤ 100 ms
	targetNodeWarmMs       = 300   // issue 28: the node, one at a time, a warm pool of 2: p50 ≤ 300 ms
	issueNodeWarmPool      = 2     // the warm pool of issue 28's node row
	targetWritesPerJob     = 6     // operator writes per job, kwok and node
	targetRSSMiB           = 200   // agentd RSS after 10 000 jobs at a steady rate
	targetRetentionJobs    = 10000 // the retention run the issue names
	targetSupervisorCPUPMB = 10    // supervisor log streaming CPU, ms per MB
	issueInFlight          = 10    // the "10 in flight" of the issue's rows
)

// TargetsInput is what one invocation of the bench measured, and why a part was not.
type TargetsInput struct {
	Dispatch []*DispatchResult
	// Runs are the sizes' runs on either backend, closed and open loop.
	Runs       []*Result
	Retention  *Result
	Supervisor *SupervisorResult
	// The Why fields say why a part was not measured: a flag, or the node's prerequisites.
	WhyNoDispatch, WhyNoNode, WhyNoRetention, WhyNoSupervisor string
}

// Target is one row of the issue's table beside what this invocation measured.
type Target struct {
	Measure  string `json:"measure"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Status is StatusMet, StatusMissed, StatusNotMeasured or StatusNotJudged; Verdict
	// says it in words: "met", "missed by 120 ms", "not measured (why)".
	Status  string `json:"status"`
	Verdict string `json:"verdict"`
}

// TargetsResult is the targets table in the JSON.
type TargetsResult struct {
	Mode    string    `json:"mode"`
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	Targets []Target  `json:"targets"`
}

// NewTargetsResult judges in against the issue's targets.
func NewTargetsResult(in TargetsInput) *TargetsResult {
	return &TargetsResult{Mode: ModeTargets, Started: time.Now(), Machine: machine(), Targets: Targets(in)}
}

// Targets is one row per target of issue 27, and issue 28's warm pickups (kwok and the
// node), judged on the median of the runs.
func Targets(in TargetsInput) []Target {
	nodeWhy := func(size int) string {
		return firstOf(in.WhyNoNode, fmt.Sprintf("no node run at %d in flight: -node-sizes", size))
	}
	return []Target{
		dispatchTarget(in.Dispatch, in.WhyNoDispatch),
		pickupTarget("accepted → started on the node, one at a time", in.Runs, BackendNode, 1, targetNodeOneOverMs, nodeWhy(1)),
		pickupTarget("accepted → started on the node, 10 in flight", in.Runs, BackendNode, issueInFlight, targetNodeTenOverMs, nodeWhy(issueInFlight)),
		pickupTarget("accepted → started on kwok, 10 in flight", in.Runs, BackendKwok, issueInFlight, targetKwokTenOverMs,
			"no kwok run at 10 in flight: -sizes"),
		warmTarget("accepted → started on kwok, 10 in flight, a warm pool as large as the load (issue 28)", in.Runs,
			BackendKwok, issueInFlight, issueInFlight, targetKwokWarmMs, "no kwok run at 10 in flight with its warm-pool phase: -sizes, -warm"),
		warmTarget("accepted → started on the node, one at a time, warm pool of 2 (issue 28)", in.Runs,
			BackendNode, 1, issueNodeWarmPool, targetNodeWarmMs, firstOf(in.WhyNoNode, "no node run at 1 in flight with its warm-pool phase: -node-sizes, -warm")),
		writesTarget(in.Runs, BackendKwok, "no kwok run: -sizes"),
		writesTarget(in.Runs, BackendNode, firstOf(in.WhyNoNode, "no node run: -node-sizes")),
		throughputTarget(in.Runs),
		rssTarget(in.Retention, firstOf(in.WhyNoRetention, "no retention run: -retention-jobs")),
		supervisorTarget(in.Supervisor, firstOf(in.WhyNoSupervisor, "not run: -supervisor-runs 0")),
	}
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func notMeasured(t Target, why string) Target {
	t.Measured, t.Status, t.Verdict = "—", StatusNotMeasured, StatusNotMeasured+" ("+why+")"
	return t
}

// judge is whether v is below limit (strict) or at most limit; a miss says by how much.
func (t Target) judge(v, limit float64, strict bool, format func(float64) string) Target {
	if v < limit || (!strict && v == limit) {
		t.Status, t.Verdict = StatusMet, StatusMet
	} else {
		t.Status, t.Verdict = StatusMissed, "missed by "+format(v-limit)
	}
	return t
}

func dispatchTarget(runs []*DispatchResult, why string) Target {
	t := Target{
		Measure: "dispatch → accepted p99, " + dispatchbench.Full.String(),
		Target:  "< 1 s with streaming; polling's beside it",
	}
	var streaming, polling []float64
	for _, r := range runs {
		if r.Setup.Description != dispatchbench.Full.String() {
			continue // the short check: not the issue's setup
		}
		for _, m := range r.PingModes {
			switch m.PingMode {
			case spawner.PingModeAuto:
				streaming = append(streaming, m.P99)
			case spawner.PingModePingOnly:
				polling = append(polling, m.P99)
			}
		}
	}
	if len(streaming) == 0 {
		if len(runs) > 0 {
			why = "the dispatch runs were the short check, not the issue's setup: -dispatch full"
		}
		return notMeasured(t, firstOf(why, "not run: -dispatch"))
	}
	t.Measured = fmt.Sprintf("streaming %s; polling %s", spreadText(streaming, ms), spreadText(polling, ms))
	return t.judge(Median(streaming), targetDispatchP99Ms, true, ms)
}

// pickupP50 is a run's pickup p50, and whether it has one.
func pickupP50(r *Result) (float64, bool) {
	for _, p := range r.Phases {
		if p.Name == pickupPhase && p.Samples > 0 {
			return p.P50, r.BarePod.Samples > 0
		}
	}
	return 0, false
}

// closedRuns are the closed-loop runs on backend (at inFlight, when above 0).
func closedRuns(runs []*Result, backend string, inFlight int) []*Result {
	var out []*Result
	for _, r := range runs {
		if r.Backend == backend && r.Mode == ModeClosed && r.Compare == "" && (inFlight == 0 || r.InFlight == inFlight) {
			out = append(out, r)
		}
	}
	return out
}

func pickupTarget(measure string, runs []*Result, backend string, inFlight int, limitMs float64, why string) Target {
	t := Target{Measure: measure, Target: "pickup p50 − bare-pod floor p50 (same run) ≤ " + ms(limitMs)}
	var over, pickup, floor []float64
	for _, r := range closedRuns(runs, backend, inFlight) {
		if p, ok := pickupP50(r); ok {
			over, pickup, floor = append(over, r.PickupOverFloorMs), append(pickup, p), append(floor, r.BarePod.P50)
		}
	}
	if len(over) == 0 {
		return notMeasured(t, why)
	}
	t.Measured = fmt.Sprintf("%s over the floor (pickup p50 %s, floor p50 %s; %d run(s))",
		spreadText(over, ms), spreadText(pickup, ms), spreadText(floor, ms), len(over))
	return t.judge(Median(over), limitMs, false, ms)
}

// warmTarget is one of issue 28's: the warm pickup p50 on backend at inFlight with a pool
// of pool warm pods, judged absolutely, with the same runs' cold pickup and floor beside it.
func warmTarget(measure string, runs []*Result, backend string, inFlight, pool int, limitMs float64, why string) Target {
	t := Target{Measure: measure, Target: "warm pickup p50 ≤ " + ms(limitMs)}
	var warm, cold, floor []float64
	started, jobs := 0, 0
	for _, r := range closedRuns(runs, backend, inFlight) {
		w, ok := r.Warm.pickup()
		if !ok || r.Warm.PoolSize != pool {
			continue
		}
		warm = append(warm, w.P50)
		if p, ok := pickupP50(r); ok {
			cold, floor = append(cold, p), append(floor, r.BarePod.P50)
		}
		started, jobs = started+r.Warm.Warm, jobs+r.Warm.Jobs
	}
	if len(warm) == 0 {
		return notMeasured(t, why)
	}
	t.Measured = fmt.Sprintf("%s (cold pickup p50 %s, floor p50 %s; %d of %d jobs started warm; %d run(s))",
		spreadText(warm, ms), spreadText(cold, ms), spreadText(floor, ms), started, jobs, len(warm))
	return t.judge(Median(warm), limitMs, false, ms)
}

// writesTarget judges the operator's writes per job on backend at every size measured, by
// the worst size's median.
func writesTarget(runs []*Result, backend, why string) Target {
	t := Target{Measure: "operator writes per job, " + backend, Target: fmt.Sprintf("≤ %d at every size", targetWritesPerJob)}
	bySize := map[int][]float64{}
	for _, r := range closedRuns(runs, backend, 0) {
		bySize[r.InFlight] = append(bySize[r.InFlight], r.Requests.OperatorWrites)
	}
	if len(bySize) == 0 {
		return notMeasured(t, why)
	}
	sizes := make([]int, 0, len(bySize))
	for n := range bySize {
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	parts := make([]string, 0, len(sizes))
	worst, worstAt := math.Inf(-1), 0
	for _, n := range sizes {
		parts = append(parts, fmt.Sprintf("%d in flight: %s", n, spreadText(bySize[n], fixed(1))))
		if m := Median(bySize[n]); m > worst {
			worst, worstAt = m, n
		}
	}
	t.Measured = strings.Join(parts, "; ")
	t = t.judge(worst, targetWritesPerJob, false, fixed(1))
	if t.Status == StatusMissed && len(sizes) > 1 {
		t.Verdict += fmt.Sprintf(" (at %d in flight)", worstAt)
	}
	return t
}

// The values of Result.Compare.
const (
	CompareBaseline = "baseline"
	CompareThis     = "this"
)

// targetThroughputRatio: kwok's jobs per second at saturation, against the commit before.
const targetThroughputRatio = 1.3

// throughputTarget is the ratio of this commit's jobs per second on kwok to the baseline's,
// medians of the comparison's alternating runs (-baseline-agentd). Without them it is
// kwok's jobs per second at its largest size, not judged: one commit's runs cannot be.
func throughputTarget(runs []*Result) Target {
	t := Target{Measure: "kwok throughput at saturation", Target: fmt.Sprintf("≥ %g× the previous commit's", targetThroughputRatio)}
	var this, base []float64
	n := 0
	for _, r := range runs {
		switch r.Compare {
		case CompareThis:
			this, n = append(this, r.JobsPerSecond), r.InFlight
		case CompareBaseline:
			base = append(base, r.JobsPerSecond)
		}
	}
	if len(this) > 0 && len(base) > 0 {
		ratio := Median(this) / Median(base)
		t.Measured = fmt.Sprintf("%.2f× (medians): %s jobs/s against the baseline's %s, %d in flight, alternating runs",
			ratio, spreadText(this, fixed(2)), spreadText(base, fixed(2)), n)
		if ratio >= targetThroughputRatio {
			t.Status, t.Verdict = StatusMet, StatusMet
		} else {
			t.Status, t.Verdict = StatusMissed, fmt.Sprintf("missed by %.2f×", targetThroughputRatio-ratio)
		}
		return t
	}
	kwok := closedRuns(runs, BackendKwok, 0)
	if len(kwok) == 0 {
		return notMeasured(t, "no kwok run: -sizes")
	}
	largest := 0
	for _, r := range kwok {
		largest = max(largest, r.InFlight)
	}
	var jps []float64
	for _, r := range closedRuns(kwok, BackendKwok, largest) {
		jps = append(jps, r.JobsPerSecond)
	}
	t.Measured = fmt.Sprintf("%s jobs/s at %d in flight", spreadText(jps, fixed(2)), largest)
	t.Status = StatusNotJudged
	t.Verdict = "not judged here: this commit's figure only; -baseline-agentd (make bench BENCH_BASELINE=<commit>) alternates runs of both commits"
	return t
}

// rssTarget judges agentd's memory over the retention run: its peak below the target, and
// flat over the run's last quarter when that quarter comes after the first retention period.
func rssTarget(r *Result, why string) Target {
	t := Target{
		Measure: "agentd RSS, 10 000 jobs at a steady rate, default retention",
		Target: fmt.Sprintf("< %d MiB, flat after the first retention period (%g h, or %d BuildJobs reported if sooner)",
			targetRSSMiB, buildJobRetention.Hours(), maxRetainedBuildJobs),
	}
	if r == nil {
		return notMeasured(t, why)
	}
	var secs, rss []float64
	for _, s := range r.Samples {
		if s.RSSMiB > 0 {
			secs, rss = append(secs, s.Seconds), append(rss, s.RSSMiB)
		}
	}
	if len(rss) == 0 {
		return notMeasured(t, "the retention run has no sample of agentd's RSS")
	}
	end, peak, duration := rss[len(rss)-1], max(slices.Max(rss), r.Agentd.PeakRSSMiB), secs[len(secs)-1]
	quarterFrom := 0.75 * duration
	slope, ok := lastQuarterSlope(secs, rss, quarterFrom)
	slopeText := "too few samples in the last quarter for a slope"
	if ok {
		slopeText = fmt.Sprintf("slope over the last quarter %+.2f MiB/min", slope*60)
	}
	rate := ""
	if r.Rate > 0 {
		rate = fmt.Sprintf(" at %g/s", r.Rate)
	}
	t.Measured = fmt.Sprintf("%d jobs%s, %d slots, %.1f min: RSS at the end %s, max %s, %s",
		r.Jobs, rate, r.InFlight, duration/60, mib(end), mib(peak), slopeText)
	t = t.judgeRSS(peak, end, slope, ok, quarterFrom, duration, firstReap(r.Rate))
	if r.Jobs < targetRetentionJobs {
		t.Verdict += fmt.Sprintf("; a run of %d jobs, not the issue's %d", r.Jobs, targetRetentionJobs)
	}
	return t
}

func (t Target) judgeRSS(peak, end, slope float64, slopeOK bool, quarterFrom, duration float64, reap time.Duration) Target {
	if t = t.judge(peak, targetRSSMiB, true, mib); t.Status == StatusMissed {
		return t
	}
	switch {
	case quarterFrom < reap.Seconds():
		t.Verdict = fmt.Sprintf("met for < %d MiB; flatness not judged: the last quarter starts at %.1f min, before the first BuildJobs are reaped (%.1f min)",
			targetRSSMiB, quarterFrom/60, reap.Minutes())
	case !slopeOK:
		t.Verdict = fmt.Sprintf("met for < %d MiB; flatness not judged: too few samples", targetRSSMiB)
	case growth(slope, duration-quarterFrom) > flatGrowth*end:
		t.Status = StatusMissed
		t.Verdict = fmt.Sprintf("missed: not flat, grew %s over the last quarter (more than %.0f%% of the RSS at the end)",
			mib(growth(slope, duration-quarterFrom)), flatGrowth*100)
	}
	return t
}

func growth(slopePerSecond, seconds float64) float64 { return slopePerSecond * seconds }

// lastQuarterSlope is the least-squares slope of ys over xs, in units per second, over the
// points at or after from; false with fewer than two.
func lastQuarterSlope(xs, ys []float64, from float64) (float64, bool) {
	var n, sx, sy, sxx, sxy float64
	for i, x := range xs {
		if x < from {
			continue
		}
		n, sx, sy, sxx, sxy = n+1, sx+x, sy+ys[i], sxx+x*x, sxy+x*ys[i]
	}
	den := n*sxx - sx*sx
	if n < 2 || den == 0 {
		return 0, false
	}
	return (n*sxy - sx*sy) / den, true
}

func supervisorTarget(r *SupervisorResult, why string) Target {
	t := Target{Measure: "supervisor log streaming CPU", Target: fmt.Sprintf("≤ %d ms/MB", targetSupervisorCPUPMB)}
	var cpu []float64
	if r != nil {
		cpu = metric(r.Stream, metricCPUPerMB)
	}
	if len(cpu) == 0 {
		return notMeasured(t, why)
	}
	t.Measured = fmt.Sprintf("%s (the floor, gzip in 100 KiB chunks: %s)", spreadText(cpu, msPerMB), spreadText(metric(r.GzipFloor, metricCPUPerMB), msPerMB))
	return t.judge(Median(cpu), targetSupervisorCPUPMB, false, msPerMB)
}

// PrintTargets writes the targets as a Markdown table.
func PrintTargets(w io.Writer, ts []Target) {
	fmt.Fprintln(w, "Issue 27's targets and issue 28's warm pickups: measured as min / median / max across the runs where there are several; each verdict on the median")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measure | target | measured | verdict |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, t := range ts {
		verdict := t.Verdict
		if t.Status == StatusMissed || t.Status == StatusMet {
			verdict = "**" + verdict + "**"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", t.Measure, t.Target, t.Measured, verdict)
	}
}
