// Command bench runs the operator's job benchmark (package tests/bench) for each size of
// jobs in flight, -runs times each, prints a table per size (min / median / max across
// the runs) and writes every run as JSON. First it measures dispatch → accepted, polling
// and streaming (-dispatch; tests/dispatchbench), -runs times too, with a table of its own.
//
//	go run ./tests/bench/cmd/bench -backend kwok -sizes 10,100,1000 -json bench.json
//	go run ./tests/bench/cmd/bench -sizes '' -runs 1            # dispatch → accepted alone: envtest, no kwok
//	go run ./tests/bench/cmd/bench -sizes 10,100 -rate 0.5x     # the closed loop, then an open loop at half its throughput
//	go run ./tests/bench/cmd/bench -sizes 50 -retention-jobs 10000 -retention-rate 5   # agentd's memory over 10 000 jobs
//	go run ./tests/bench/cmd/bench -backend node -sizes 10 -json bench-node.json   # root
//	go run ./tests/bench/cmd/bench -node-sizes 1,10 -supervisor bin/linux/agentd-supervise -then-retention -retention-jobs 10000   # everything issue 27 names, its targets table last
//
// At the end it prints issue 27's targets, and issue 28's warm pickups (kwok's and the
// node's), beside what it measured (targets.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/bench"
)

// options are the command's flags.
type options struct {
	backend, sizes, rate, jsonPath, dir, agentd, operatorArgs, operatorEnv, dispatch string
	nodeSizes, supervisor                                                            string
	baselineAgentd                                                                   string
	rounds, runs, retentionJobs, retentionSlots, supervisorRuns, baselineSize        int
	retentionRate                                                                    float64
	thenRetention, warm                                                              bool
	commandDuration, timeout, nodeWait, sampleEvery                                  time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.backend, "backend", bench.BackendKwok, "where pods run: kwok (a real API server, simulated nodes) or node (the local node; root)")
	flag.StringVar(&o.sizes, "sizes", "10,100,1000", "comma-separated jobs in flight (the operator's slots); empty for none: the dispatch measurement alone")
	flag.StringVar(&o.dispatch, "dispatch", dispatchFull, "dispatch → accepted, measured first on envtest, -runs times (not in the retention mode): "+
		dispatchFull+" (polling and streaming, "+bench.DispatchFull.Setup.String()+", about 3 minutes a run), "+
		dispatchCheck+" (streaming, "+bench.DispatchCheck.Setup.String()+", once) or "+dispatchOff+"; either fails if a streaming job was taken from a ping rather than the push")
	flag.IntVar(&o.runs, "runs", 3, "runs of each size (and mode): the table gives each figure's min / median / max across them")
	flag.IntVar(&o.rounds, "rounds", 2, "jobs per slot: each run queues size × rounds jobs")
	flag.StringVar(&o.rate, "rate", "", "open loop: jobs arrive at this many a second instead of all at once; Fx (0.5x) runs the closed loop first, then the open loop at F × its median jobs per second")
	flag.StringVar(&o.nodeSizes, "node-sizes", "", "after the -sizes, these sizes on the node backend (the local node; root, make cluster-binaries images): skipped, with a line saying why, where the node cannot run")
	flag.IntVar(&o.supervisorRuns, "supervisor-runs", 3, "then the log streaming benchmark (pkg/supervisor's SupervisorStream) and its gzip floor (pkg/agentapi's GzipFloor/chunks), this many runs each with go test; 0: not")
	flag.StringVar(&o.supervisor, "supervisor", "", "the agentd-supervise binary the log streaming benchmark runs (make release-binaries: bin/linux/agentd-supervise; default: built from this checkout the same way)")
	flag.IntVar(&o.retentionJobs, "retention-jobs", 0, "the retention mode: one run of this many jobs through the first size's slots at -retention-rate, with the operator's default retention, and agentd's memory over time")
	flag.BoolVar(&o.thenRetention, "then-retention", false, "run the retention run last, after everything else, on kwok through -retention-slots slots, instead of as a mode of its own; -retention-jobs 0 skips it")
	flag.IntVar(&o.retentionSlots, "retention-slots", 50, "the slots of the retention run with -then-retention")
	flag.Float64Var(&o.retentionRate, "retention-rate", 5, "the retention mode's jobs per second")
	flag.DurationVar(&o.sampleEvery, "sample-every", 5*time.Second, "how often agentd's memory and the run's progress are sampled (in the JSON; printed in the retention mode)")
	flag.BoolVar(&o.warm, "warm", true, fmt.Sprintf("after the closed loop's jobs of each size up to %d in flight, kwok's and the node's, in the same run, a warm-pool phase (issue 28): a pool of as many warm pods as jobs in flight (on the node at least 2), -rounds rounds of as many jobs as are in flight at once, its pickup beside the cold one and the floor; agentd then serves its webhook server (the hand-off endpoint) in that run, on the node to the pods through a Service to this host", bkv1.WarmPoolMaxSize))
	flag.DurationVar(&o.commandDuration, "command-duration", 0, "how long each job's command runs")
	flag.StringVar(&o.jsonPath, "json", "bench.json", "write every run here, as a JSON array (the dispatch runs' mode is \""+bench.ModeDispatch+"\")")
	flag.StringVar(&o.dir, "dir", "", "keep each run's logs, kubeconfigs and audit log under this folder (default: a temporary one, removed after a run that passed)")
	flag.StringVar(&o.agentd, "agentd", "", "the agentd binary to run as the operator (default: built from this checkout)")
	flag.StringVar(&o.baselineAgentd, "baseline-agentd", "", "another commit's agentd: after the -sizes, -runs runs on kwok at -baseline-size in flight with it and as many with this one, in turn, for the throughput target (this commit's median jobs per second over the baseline's); none when empty")
	flag.IntVar(&o.baselineSize, "baseline-size", 100, "jobs in flight of the throughput comparison: the kwok size where the machine is saturated")
	flag.StringVar(&o.operatorArgs, "operator-args", "", "more flags for `agentd operator`, space-separated")
	flag.StringVar(&o.operatorEnv, "operator-env", "", "NAME=value pairs for `agentd operator`'s environment alone, space-separated (GOMEMLIMIT=200MiB)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "how long one run's jobs may take after the last is queued")
	flag.DurationVar(&o.nodeWait, "node-wait", 30*time.Minute, "node backend: how long to wait for another local node (the end-to-end suite) to stop")
	flag.Parse()
	// The bench's own clients log nothing worth reading; the components log to files.
	log.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func run(ctx context.Context, o options) error {
	plan, err := parsePlan(o)
	if err != nil {
		return err
	}
	b := &bencher{o: o}
	if o.supervisor != "" && o.supervisorRuns > 0 {
		// Checked now, not after the hour of runs before it.
		if b.o.supervisor, err = checkBinary("-supervisor", o.supervisor, supervisorHint); err != nil {
			return err
		}
	}
	if b.o.baselineAgentd, err = checkBaseline(o.baselineAgentd); err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(b.tmp) }()
	if plan.dispatch != nil {
		if err := b.dispatch(ctx, *plan.dispatch); err != nil {
			return err
		}
	}
	if o.retentionJobs > 0 && !o.thenRetention {
		// The retention mode: its run alone.
		res, err := b.retention(ctx, o.backend, plan.sizes[0])
		if err != nil {
			return err
		}
		b.in.Retention = res
		b.in.WhyNoDispatch, b.in.WhyNoNode, b.in.WhyNoSupervisor = whyRetentionMode, whyRetentionMode, whyRetentionMode
		return b.targets()
	}
	for _, n := range plan.sizes {
		if err := b.size(ctx, o.backend, n, plan.rate); err != nil {
			return err
		}
	}
	if b.o.baselineAgentd != "" {
		if err := b.compare(ctx); err != nil {
			return err
		}
	}
	if err := b.nodeSizes(ctx, plan.nodeSizes, plan.rate, thisHost()); err != nil {
		return err
	}
	if err := b.supervisorBench(ctx); err != nil {
		return err
	}
	if o.thenRetention && o.retentionJobs > 0 {
		if b.in.Retention, err = b.retention(ctx, bench.BackendKwok, o.retentionSlots); err != nil {
			return err
		}
	}
	return b.targets()
}

// size runs one size: the closed loop, the open loop, or both, as -rate says.
func (b *bencher) size(ctx context.Context, backend string, n int, rate rateFlag) error {
	open := rate.perSecond
	if open == 0 || rate.fraction > 0 {
		closed, err := b.series(ctx, backend, n, 0, 0, b.o.runs)
		b.in.Runs = append(b.in.Runs, closed...)
		if err != nil {
			return err
		}
		if rate.fraction == 0 {
			return nil
		}
		jps := make([]float64, len(closed))
		for i, r := range closed {
			jps[i] = r.JobsPerSecond
		}
		open = rate.fraction * bench.Median(jps)
		logf("%d in flight: the open loop at %g × %.2f jobs a second, the closed loop's median", n, rate.fraction, bench.Median(jps))
	}
	runs, err := b.series(ctx, backend, n, open, 0, b.o.runs)
	b.in.Runs = append(b.in.Runs, runs...)
	return err
}

// retention is the retention run: o.retentionJobs jobs at o.retentionRate through slots,
// with agentd's memory over time.
func (b *bencher) retention(ctx context.Context, backend string, slots int) (*bench.Result, error) {
	runs, err := b.series(ctx, backend, slots, b.o.retentionRate, b.o.retentionJobs, 1)
	if err != nil {
		return nil, err
	}
	fmt.Println()
	bench.PrintSamples(os.Stdout, runs[0])
	return runs[0], nil
}

// bencher runs the bench and keeps every run's result: *bench.Result and
// *bench.DispatchResult, told apart by their mode in the JSON.
type bencher struct {
	o       options
	results []any
	// in is what the targets are judged from.
	in bench.TargetsInput
	// tmp holds the binaries the bench built (agentd, agentd-supervise), if any.
	tmp string
}

// dispatch measures cfg -runs times (or cfg.Runs), writes the JSON after each run and
// prints the table, of the runs before a failed one too.
func (b *bencher) dispatch(ctx context.Context, cfg bench.DispatchConfig) error {
	runs := b.o.runs
	if cfg.Runs > 0 {
		runs = cfg.Runs
	}
	logf("dispatch → accepted: starting the API server (envtest)")
	d, err := bench.StartDispatcher()
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	var out []*bench.DispatchResult
	defer func() {
		fmt.Println()
		bench.PrintDispatch(os.Stdout, out)
	}()
	for i := 1; i <= runs; i++ {
		logf("dispatch → accepted: run %d of %d", i, runs)
		res, err := d.Run(ctx, cfg, logf)
		if res != nil {
			res.Run = i
			out = append(out, res)
			b.in.Dispatch = append(b.in.Dispatch, res)
			b.results = append(b.results, res)
			if werr := b.write(); werr != nil {
				return werr
			}
		}
		if err != nil {
			return fmt.Errorf("dispatch → accepted, run %d: %w", i, err)
		}
	}
	return nil
}

// runConfig is one run's configuration from the flags: n jobs in flight on backend, the
// open loop at rate (0: the closed loop), jobs in all (0: n × -rounds), agentd as the
// operator, its logs under -dir's folder dir when -dir is given. No warm-pool phase.
func (b *bencher) runConfig(backend string, n int, rate float64, jobs int, agentd, dir string) bench.Config {
	cfg := bench.Config{
		Backend: backend, InFlight: n, Rounds: b.o.rounds, Jobs: jobs, Rate: rate, SampleEvery: b.o.sampleEvery,
		CommandDuration: b.o.commandDuration, Timeout: b.o.timeout, Agentd: agentd,
		OperatorArgs: strings.Fields(b.o.operatorArgs), OperatorEnv: strings.Fields(b.o.operatorEnv), NodeWait: b.o.nodeWait, Logf: logf,
	}
	if b.o.dir != "" {
		cfg.Dir = filepath.Join(b.o.dir, dir)
	}
	return cfg
}

// record runs cfg as run number run and keeps its result, writing the JSON at once, so
// that a later run that fails keeps the earlier ones. The result is nil when the run
// failed; the error is the run's, unwrapped, or the JSON's.
func (b *bencher) record(ctx context.Context, cfg bench.Config, run int) (*bench.Result, error) {
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	res.Run = run
	b.results = append(b.results, res)
	return res, b.write()
}

// series runs one size and mode on backend runs times, writes the JSON after each run and
// prints the table. It returns the runs before a failed one with the error.
func (b *bencher) series(ctx context.Context, backend string, n int, rate float64, jobs, runs int) ([]*bench.Result, error) {
	agentd, err := b.agentd(ctx)
	if err != nil {
		return nil, err
	}
	mode := "closed"
	if rate > 0 {
		mode = "open"
	}
	var out []*bench.Result
	for i := 1; i <= runs; i++ {
		cfg := b.runConfig(backend, n, rate, jobs, agentd, fmt.Sprintf("%s-%d-%s-%d", backend, n, mode, i))
		cfg.Warm = b.o.warmFor(backend, n, rate, jobs)
		logf("%d in flight, %s loop: run %d of %d", n, mode, i, runs)
		res, err := b.record(ctx, cfg, i)
		if res != nil {
			out = append(out, res)
		}
		if err != nil {
			return out, fmt.Errorf("%s backend, %d jobs in flight, %s loop, run %d: %w", backend, n, mode, i, err)
		}
	}
	fmt.Println()
	bench.PrintRuns(os.Stdout, out)
	return out, nil
}

func (b *bencher) write() error {
	data, err := json.MarshalIndent(b.results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(b.o.jsonPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(b.o.jsonPath, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", b.o.jsonPath, err)
	}
	return nil
}
