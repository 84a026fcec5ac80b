package main

import (
	"context"
	"fmt"

	"github.com/buildkite-operator/buildkite-operator/tests/bench"
)

// compare is the throughput comparison: -runs closed-loop runs on kwok at
// -baseline-size jobs in flight with the baseline agentd and as many with this one, in turn
// (baseline, this, baseline, ...), so that both meet the machine as it is at the time. The
// target compares medians; the runs stay out of every other figure (Result.Compare).
func (b *bencher) compare(ctx context.Context) error {
	this, err := b.agentd(ctx)
	if err != nil {
		return err
	}
	binaries := []struct{ which, path string }{{bench.CompareBaseline, b.o.baselineAgentd}, {bench.CompareThis, this}}
	var out []*bench.Result
	for i := 1; i <= b.o.runs; i++ {
		for _, a := range binaries {
			// No warm-pool phase: the baseline may predate warm pools.
			cfg := b.runConfig(bench.BackendKwok, b.o.baselineSize, 0, 0, a.path, fmt.Sprintf("compare-%s-%d", a.which, i))
			logf("throughput comparison, %d in flight: %s agentd (%s), run %d of %d", b.o.baselineSize, a.which, a.path, i, b.o.runs)
			res, err := b.record(ctx, cfg, i)
			if res != nil {
				res.Compare = a.which
				out = append(out, res)
				b.in.Runs = append(b.in.Runs, res)
			}
			if err != nil {
				return fmt.Errorf("throughput comparison, %s agentd %s, run %d: %w", a.which, a.path, i, err)
			}
		}
	}
	fmt.Println()
	fmt.Printf("throughput comparison: kwok, %d in flight, runs of the baseline agentd (%s) and this one in turn\n", b.o.baselineSize, b.o.baselineAgentd)
	for _, r := range out {
		fmt.Printf("  run %d, %s: %.2f jobs/s, agentd writes %.1f a job\n", r.Run, r.Compare, r.JobsPerSecond, r.Requests.OperatorWrites)
	}
	return nil
}

// checkBaseline is -baseline-agentd's binary, checked before the runs.
func checkBaseline(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	return checkBinary("-baseline-agentd", path, "build the other commit's agentd, or use make bench BENCH_BASELINE=<commit>")
}
