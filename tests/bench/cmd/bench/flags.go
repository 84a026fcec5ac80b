package main

import (
	"fmt"
	"strconv"
	"strings"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/bench"
)

// parseSizes reads the flag name (-sizes, -node-sizes): positive numbers of jobs in
// flight, comma-separated; none when empty.
func parseSizes(name, sizes string) ([]int, error) {
	var ns []int
	if strings.TrimSpace(sizes) == "" {
		return nil, nil
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive number of jobs", name, s)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// rateFlag is -rate: none (the closed loop alone), jobs per second (the open loop alone),
// or a fraction of the closed loop's throughput (both, the closed loop first).
type rateFlag struct {
	perSecond, fraction float64
}

func parseRate(s string) (rateFlag, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return rateFlag{}, nil
	}
	num, isFraction := strings.CutSuffix(s, "x")
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return rateFlag{}, fmt.Errorf("-rate: %q is neither jobs per second (5) nor a fraction of the closed loop's throughput (0.5x)", s)
	}
	if isFraction {
		return rateFlag{fraction: v}, nil
	}
	return rateFlag{perSecond: v}, nil
}

// The values of -dispatch.
const (
	dispatchFull  = "full"
	dispatchCheck = "check"
	dispatchOff   = "off"
)

// parseDispatch reads -dispatch: the dispatch measurement to run, or nil for none.
func parseDispatch(s string) (*bench.DispatchConfig, error) {
	switch strings.TrimSpace(s) {
	case dispatchFull:
		return &bench.DispatchFull, nil
	case dispatchCheck:
		return &bench.DispatchCheck, nil
	case dispatchOff:
		return nil, nil
	}
	return nil, fmt.Errorf("-dispatch: %q is none of %s (polling and streaming, %s), %s (streaming, %s) and %s",
		s, dispatchFull, bench.DispatchFull.Setup, dispatchCheck, bench.DispatchCheck.Setup, dispatchOff)
}

// plan is what the flags ask for, checked before anything runs: a mistake found after an
// hour of runs costs the hour.
type plan struct {
	sizes, nodeSizes []int
	rate             rateFlag
	dispatch         *bench.DispatchConfig
}

func parsePlan(o options) (p plan, err error) {
	if p.sizes, err = parseSizes("-sizes", o.sizes); err != nil {
		return p, err
	}
	if p.nodeSizes, err = parseSizes("-node-sizes", o.nodeSizes); err != nil {
		return p, err
	}
	if p.rate, err = parseRate(o.rate); err != nil {
		return p, err
	}
	if p.dispatch, err = parseDispatch(o.dispatch); err != nil {
		return p, err
	}
	switch {
	case o.runs < 1:
		return p, fmt.Errorf("-runs: %d: at least one run of each size", o.runs)
	case o.supervisorRuns < 0:
		return p, fmt.Errorf("-supervisor-runs: %d: give a number of runs, or 0 for none", o.supervisorRuns)
	case o.retentionJobs > 0 && o.retentionRate <= 0:
		return p, fmt.Errorf("-retention-rate: %g: the retention run's jobs arrive at a rate above 0 a second", o.retentionRate)
	case o.retentionJobs > 0 && o.thenRetention && o.retentionSlots <= 0:
		return p, fmt.Errorf("-retention-slots: %d: the retention run needs at least one slot", o.retentionSlots)
	}
	if o.retentionJobs > 0 && !o.thenRetention {
		// The retention mode runs the retention run alone.
		if len(p.sizes) != 1 {
			return p, fmt.Errorf("-retention-jobs without -then-retention is the retention mode: give it one size (-sizes, the slots), not %q", o.sizes)
		}
		if len(p.nodeSizes) > 0 {
			return p, fmt.Errorf("-node-sizes: the retention mode runs nothing else; add -then-retention to run the retention run after the sizes")
		}
		p.dispatch = nil
		return p, nil
	}
	if len(p.sizes) == 0 && len(p.nodeSizes) == 0 && p.dispatch == nil && o.supervisorRuns == 0 && (!o.thenRetention || o.retentionJobs == 0) {
		return p, fmt.Errorf("nothing to run: -sizes and -node-sizes are empty, -dispatch is %s, -supervisor-runs is 0 and there is no retention run; give sizes, or -dispatch %s or %s",
			dispatchOff, dispatchFull, dispatchCheck)
	}
	return p, nil
}

// warmFor tells whether a run of n in flight on backend, at rate (0: the closed loop) with
// jobs (0: n × -rounds; else the retention run), has the warm-pool phase: with -warm, in the
// closed loop, at sizes whose pool (bench.WarmPoolSize) a BuildEnvironment can keep.
func (o options) warmFor(backend string, n int, rate float64, jobs int) bool {
	return o.warm && rate == 0 && jobs == 0 && bench.WarmPoolSize(backend, n) <= bkv1.WarmPoolMaxSize
}
