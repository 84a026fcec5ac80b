package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/dispatchbench"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// ModeDispatch is the mode of a dispatch measurement in the JSON, beside ModeClosed and
// ModeOpen.
const ModeDispatch = "dispatch"

// BackendEnvtest is where the dispatch measurement runs: a bare API server (envtest), the
// spawner in the bench's process and the fake Buildkite; no pod, no kwok.
const BackendEnvtest = "envtest"

// DispatchConfig is one dispatch measurement: Setup through each of PingModes in turn.
type DispatchConfig struct {
	Setup     dispatchbench.Setup
	PingModes []string
	// Runs, when above 0, is how many runs it takes, whatever the bench's -runs.
	Runs int
}

// DispatchFull is issue 27's measurement, polling and streaming side by side
// (docs/performance.md, "Streaming dispatch"): about three minutes a run.
var DispatchFull = DispatchConfig{Setup: dispatchbench.Full, PingModes: []string{spawner.PingModePingOnly, spawner.PingModeAuto}}

// DispatchCheck is a short check that streaming takes every job from the push, in
// seconds; it times nothing that could fail.
var DispatchCheck = DispatchConfig{Setup: dispatchbench.Short, PingModes: []string{spawner.PingModeAuto}, Runs: 1}

// DispatchResult is one run of a dispatch measurement, as the JSON has it.
type DispatchResult struct {
	Backend string `json:"backend"`
	// Mode is ModeDispatch.
	Mode    string        `json:"mode"`
	Run     int           `json:"run,omitempty"`
	Started time.Time     `json:"started"`
	Machine Machine       `json:"machine"`
	Setup   DispatchSetup `json:"setup"`
	// PingModes are the figures of each ping mode, in the order measured.
	PingModes []DispatchMode `json:"ping_modes"`
}

// DispatchSetup is dispatchbench.Setup in the JSON.
type DispatchSetup struct {
	Description         string  `json:"description"`
	PingIntervalSeconds int     `json:"ping_interval_seconds"`
	Slots               int     `json:"slots"`
	Jobs                int     `json:"jobs"`
	MinGapSeconds       float64 `json:"min_gap_seconds"`
	MaxGapSeconds       float64 `json:"max_gap_seconds"`
}

// DispatchMode is dispatch → accepted in one ping mode: percentiles by nearest rank, in
// milliseconds, and every job's.
type DispatchMode struct {
	PingMode string  `json:"ping_mode"`
	Samples  int     `json:"samples"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	// FromPing counts the jobs taken from a ping's answer rather than the stream's push.
	FromPing int       `json:"taken_from_a_ping"`
	Waits    []float64 `json:"dispatch_to_accepted_ms"`
}

// Dispatcher runs dispatch measurements on an API server of its own.
type Dispatcher struct {
	env *testenv.Env
}

// StartDispatcher starts the API server (envtest) the dispatch measurements share.
func StartDispatcher() (*Dispatcher, error) {
	env, err := testenv.Start()
	if err != nil {
		return nil, fmt.Errorf("the dispatch measurement's API server: %w", err)
	}
	return &Dispatcher{env: env}, nil
}

// Close stops the API server.
func (d *Dispatcher) Close() error { return d.env.Stop() }

// Run measures cfg once, each ping mode in a namespace and spawner of its own. When a
// mode's dispatch went wrong (dispatchbench.Run.Check) it returns the result with the
// error, so that the caller can keep what was measured.
func (d *Dispatcher) Run(ctx context.Context, cfg DispatchConfig, logf func(string, ...any)) (*DispatchResult, error) {
	s := cfg.Setup
	res := &DispatchResult{
		Backend: BackendEnvtest, Mode: ModeDispatch, Started: time.Now(), Machine: machine(),
		Setup: DispatchSetup{
			Description: s.String(), PingIntervalSeconds: s.PingInterval, Slots: s.Slots, Jobs: s.Jobs,
			MinGapSeconds: s.MinGap.Seconds(), MaxGapSeconds: s.MaxGap.Seconds(),
		},
	}
	var checks []error
	for _, mode := range cfg.PingModes {
		logf("dispatch → accepted, %s: %s", mode, s)
		run, err := dispatchbench.Measure(ctx, d.env, s, mode, logr.Discard())
		if err != nil {
			return nil, fmt.Errorf("dispatch, %s: %w", mode, err)
		}
		p := dispatchbench.Summarize(run.Waits())
		m := DispatchMode{
			PingMode: mode, Samples: p.Samples, P50: toMs(p.P50), P90: toMs(p.P90), P99: toMs(p.P99), Max: toMs(p.Max),
			FromPing: run.FromPing(),
		}
		for _, w := range run.Waits() {
			m.Waits = append(m.Waits, toMs(w))
		}
		res.PingModes = append(res.PingModes, m)
		if err := run.Check(); err != nil {
			checks = append(checks, err)
		}
	}
	res.Machine.LoadAfter = loadAverage()
	return res, errors.Join(checks...)
}

func toMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// PrintDispatch writes runs of one dispatch measurement as a Markdown table: a row per
// ping mode, a column per percentile, each cell the min / median / max across the runs.
func PrintDispatch(w io.Writer, runs []*DispatchResult) {
	if len(runs) == 0 {
		return
	}
	first := runs[0]
	loads := make([]float64, 0, 2*len(runs))
	for _, r := range runs {
		loads = append(loads, r.Machine.LoadBefore, r.Machine.LoadAfter)
	}
	load := newSpread(loads)
	fmt.Fprintf(w, "dispatch → accepted (Buildkite's created_at → accepted_at): %s backend, the spawner in the bench's process, the fake Buildkite; %d run(s)\n",
		first.Backend, len(runs))
	fmt.Fprintf(w, "machine: %d CPUs, load average %.1f to %.1f before and after the runs; %s\n",
		first.Machine.CPUs, load.min, load.max, first.Machine.Commit)
	rank := "percentiles by nearest rank"
	if first.Setup.Jobs < 100 {
		rank += fmt.Sprintf(" (with %d jobs, p99 is the slowest job)", first.Setup.Jobs)
	}
	if len(runs) > 1 {
		rank += "; each cell is min / median / max across the runs"
	}
	fmt.Fprintln(w, rank)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| dispatch → accepted, %s | p50 | p90 | p99 |\n", first.Setup.Description)
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, mode := range dispatchModes(runs) {
		fromPing, jobs := 0, 0
		values := make([][]float64, 3) // p50, p90, p99 of each run
		for _, r := range runs {
			for _, m := range r.PingModes {
				if m.PingMode == mode {
					values[0], values[1], values[2] = append(values[0], m.P50), append(values[1], m.P90), append(values[2], m.P99)
					fromPing, jobs = fromPing+m.FromPing, jobs+m.Samples
				}
			}
		}
		name := describePingMode(mode)
		if mode == spawner.PingModeAuto && fromPing > 0 {
			name += fmt.Sprintf(" — %d of %d jobs taken from a ping, not the push", fromPing, jobs)
		}
		cells := make([]string, len(values))
		for i, vs := range values {
			cells[i] = spreadCell(vs)
		}
		fmt.Fprintf(w, "| %s | %s |\n", name, strings.Join(cells, " | "))
	}
}

// spreadCell is one run's value, or the min / median / max of several.
func spreadCell(vs []float64) string {
	s := newSpread(vs)
	if len(vs) == 1 {
		return ms(s.min)
	}
	return ms(s.min) + " / " + ms(s.median) + " / " + ms(s.max)
}

// dispatchModes are the runs' ping modes, in the order measured.
func dispatchModes(runs []*DispatchResult) []string {
	var out []string
	for _, r := range runs {
		for _, m := range r.PingModes {
			if !slices.Contains(out, m.PingMode) {
				out = append(out, m.PingMode)
			}
		}
	}
	return out
}

// describePingMode names a ping mode as docs/performance.md does.
func describePingMode(mode string) string {
	switch mode {
	case spawner.PingModePingOnly:
		return "polling (`--ping-mode ping-only`)"
	case spawner.PingModeAuto:
		return "streaming (`--ping-mode auto`)"
	}
	return "`--ping-mode " + mode + "`"
}
