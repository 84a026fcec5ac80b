package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/bench"
	"github.com/buildkite-operator/buildkite-operator/tests/dispatchbench"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want rateFlag
		err  bool
	}{
		{"", rateFlag{}, false},
		{"5", rateFlag{perSecond: 5}, false},
		{" 2.5 ", rateFlag{perSecond: 2.5}, false},
		{"0.5x", rateFlag{fraction: 0.5}, false},
		{"0", rateFlag{}, true},
		{"-1x", rateFlag{}, true},
		{"fast", rateFlag{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseRate(tt.in)
			if tt.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseSizes(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		err  bool
	}{
		{"10, 100,1000", []int{10, 100, 1000}, false},
		{"", nil, false}, // none: the dispatch measurement alone
		{"  ", nil, false},
		{"10,", nil, true},
		{",10", nil, true},
		{"0", nil, true},
		{"ten", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSizes("-sizes", tt.in)
			if tt.err {
				assert.ErrorContains(t, err, "-sizes")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseDispatch(t *testing.T) {
	tests := []struct {
		in   string
		want *bench.DispatchConfig
		err  bool
	}{
		{"full", &bench.DispatchFull, false},
		{" check ", &bench.DispatchCheck, false},
		{"off", nil, false},
		{"", nil, true},
		{"true", nil, true},
		{"Full", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseDispatch(tt.in)
			if tt.err {
				assert.ErrorContains(t, err, "is none of full (polling and streaming, ping interval 10 s, 8 slots, 20 jobs 2-6 s apart), check")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	// What the flag's help promises: the full measurement compares the two ping modes
	// over issue 27's setup, the check runs streaming alone, once.
	assert.Equal(t, []string{spawner.PingModePingOnly, spawner.PingModeAuto}, bench.DispatchFull.PingModes)
	assert.Equal(t, dispatchbench.Full, bench.DispatchFull.Setup)
	assert.Zero(t, bench.DispatchFull.Runs, "the full measurement takes -runs runs")
	assert.Equal(t, []string{spawner.PingModeAuto}, bench.DispatchCheck.PingModes)
	assert.Equal(t, 1, bench.DispatchCheck.Runs)
}

func TestWarmFor(t *testing.T) {
	tests := []struct {
		name    string
		warm    bool
		backend string
		n       int
		rate    float64
		jobs    int
		want    bool
	}{
		{"kwok, 10 in flight, closed loop", true, bench.BackendKwok, 10, 0, 0, true},
		{"the largest pool", true, bench.BackendKwok, 20, 0, 0, true},
		{"more in flight than a pool holds", true, bench.BackendKwok, 21, 0, 0, false},
		{"-warm=false", false, bench.BackendKwok, 10, 0, 0, false},
		{"the node, 10 in flight", true, bench.BackendNode, 10, 0, 0, true},
		{"the node, one at a time: a pool of 2", true, bench.BackendNode, 1, 0, 0, true},
		{"the node, more in flight than a pool holds", true, bench.BackendNode, 21, 0, 0, false},
		{"the node, -warm=false", false, bench.BackendNode, 1, 0, 0, false},
		{"the node's open loop", true, bench.BackendNode, 1, 2, 0, false},
		{"the open loop", true, bench.BackendKwok, 10, 2.5, 0, false},
		{"the retention run", true, bench.BackendKwok, 10, 5, 10000, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := defaults()
			o.warm = tt.warm
			assert.Equal(t, tt.want, o.warmFor(tt.backend, tt.n, tt.rate, tt.jobs))
		})
	}
}
