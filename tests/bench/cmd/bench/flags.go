package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/tests/bench"
)

// parseSizes reads -sizes: positive numbers of jobs in flight, comma-separated; none
// when empty (the dispatch measurement alone).
func parseSizes(sizes string) ([]int, error) {
	var ns []int
	if strings.TrimSpace(sizes) == "" {
		return nil, nil
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-sizes: %q is not a positive number of jobs", s)
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
