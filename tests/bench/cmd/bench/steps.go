package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/buildkite-operator/buildkite-operator/tests/bench"
)

// whyRetentionMode is why the retention mode's targets table has nothing else.
const whyRetentionMode = "the retention mode runs nothing else: -then-retention runs it after the rest"

// tmpDir is where the bench builds the binaries it was not given.
func (b *bencher) tmpDir() (string, error) {
	if b.tmp == "" {
		var err error
		if b.tmp, err = os.MkdirTemp("", "bench-bin-"); err != nil {
			return "", err
		}
	}
	return b.tmp, nil
}

// agentd is -agentd, or agentd built from this checkout the first time it is needed.
func (b *bencher) agentd(ctx context.Context) (string, error) {
	if b.o.agentd != "" {
		return b.o.agentd, nil
	}
	dir, err := b.tmpDir()
	if err != nil {
		return "", err
	}
	logf("building agentd")
	b.o.agentd, err = bench.BuildAgentd(ctx, dir)
	return b.o.agentd, err
}

// nodeSizes runs the sizes on the node backend, or says in one line why the node cannot
// run here and goes on: the node rows of the targets say so too.
func (b *bencher) nodeSizes(ctx context.Context, sizes []int, rate rateFlag, host nodeHost) error {
	if len(sizes) == 0 {
		return nil
	}
	if why := host.whyNoNode(); why != "" {
		b.in.WhyNoNode = "skipped: " + why
		fmt.Printf("\nnode rows (-node-sizes %s) skipped: %s\n", b.o.nodeSizes, why)
		return nil
	}
	for _, n := range sizes {
		if err := b.size(ctx, bench.BackendNode, n, rate); err != nil {
			return err
		}
	}
	return nil
}

// supervisorBench runs the log streaming benchmark -supervisor-runs times and prints it.
func (b *bencher) supervisorBench(ctx context.Context) error {
	if b.o.supervisorRuns == 0 {
		return nil
	}
	bin, err := b.supervisorBinary(ctx)
	if err != nil {
		return err
	}
	res, err := bench.RunSupervisor(ctx, bin, b.o.supervisorRuns, logf)
	if err != nil {
		return fmt.Errorf("log streaming benchmark: %w", err)
	}
	b.in.Supervisor = res
	b.results = append(b.results, res)
	if err := b.write(); err != nil {
		return err
	}
	fmt.Println()
	bench.PrintSupervisor(os.Stdout, res)
	return nil
}

// supervisorBinary is -supervisor as an absolute path (go test runs the benchmark in its
// package's folder), or agentd-supervise built as the image's is.
func (b *bencher) supervisorBinary(ctx context.Context) (string, error) {
	if b.o.supervisor == "" {
		dir, err := b.tmpDir()
		if err != nil {
			return "", err
		}
		logf("building agentd-supervise")
		return bench.BuildSupervisor(ctx, dir)
	}
	return checkBinary("-supervisor", b.o.supervisor, supervisorHint)
}

// supervisorHint says where -supervisor's binary comes from.
const supervisorHint = "make release-binaries builds bin/linux/agentd-supervise; or leave -supervisor empty to build one"

// checkBinary is path made absolute, if it is a file that can be run; hint says, when it
// is missing, how to make it.
func checkBinary(flagName, path, hint string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", flagName, path, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%s: %w (%s)", flagName, err, hint)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s: %s is not an executable file", flagName, abs)
	}
	return abs, nil
}

// targets judges what was measured against issue 27's targets, adds the table to the JSON
// and prints it.
func (b *bencher) targets() error {
	if b.in.WhyNoDispatch == "" && b.o.dispatch == dispatchOff {
		b.in.WhyNoDispatch = "not run: -dispatch off"
	}
	if b.in.WhyNoRetention == "" && b.in.Retention == nil {
		b.in.WhyNoRetention = "not run: -then-retention with -retention-jobs above 0 runs it"
		if b.o.thenRetention {
			b.in.WhyNoRetention = "not run: -retention-jobs 0"
		}
	}
	res := bench.NewTargetsResult(b.in)
	b.results = append(b.results, res)
	if err := b.write(); err != nil {
		return err
	}
	fmt.Println()
	bench.PrintTargets(os.Stdout, res.Targets)
	return nil
}
