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
