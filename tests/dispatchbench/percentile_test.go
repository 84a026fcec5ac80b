package dispatchbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSummarize(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	seq := func(n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(n-i) * time.Millisecond // unsorted on purpose
		}
		return out
	}
	tests := []struct {
		name string
		in   []time.Duration
		want Percentiles
	}{
		{"none", nil, Percentiles{}},
		{"one", ms(7), Percentiles{Samples: 1, P50: 7 * time.Millisecond, P90: 7 * time.Millisecond, P99: 7 * time.Millisecond, Max: 7 * time.Millisecond}},
		// Issue 27's 20 jobs: p50 is the 10th, p90 the 18th, p99 the 20th, the max.
		{"twenty", seq(20), Percentiles{Samples: 20, P50: 10 * time.Millisecond, P90: 18 * time.Millisecond, P99: 20 * time.Millisecond, Max: 20 * time.Millisecond}},
		{"five", ms(50, 10, 40, 20, 30), Percentiles{Samples: 5, P50: 30 * time.Millisecond, P90: 50 * time.Millisecond, P99: 50 * time.Millisecond, Max: 50 * time.Millisecond}},
		// p99 of 100 is the 99th value, not the max.
		{"hundred", seq(100), Percentiles{Samples: 100, P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}},
		{"ties", ms(5, 5, 5, 9), Percentiles{Samples: 4, P50: 5 * time.Millisecond, P90: 9 * time.Millisecond, P99: 9 * time.Millisecond, Max: 9 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tt.in...)
			assert.Equal(t, tt.want, Summarize(tt.in))
			assert.Equal(t, in, tt.in, "the sample is left unsorted")
		})
	}
}

func TestNearestRank(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"p50 of 2 is the first", []time.Duration{1, 2}, 50, 1},
		{"p51 of 2 is the second", []time.Duration{1, 2}, 51, 2},
		{"p100 is the max", []time.Duration{1, 2, 3}, 100, 3},
		{"tiny p is the min", []time.Duration{1, 2, 3}, 0.1, 1},
		// p/100 × n would make this rank 8: 0.07 × 100 is a hair above 7.
		{"p7 of 100 is the 7th", hundred, 7, 7},
		{"p28 of 25 is the 7th", hundred[:25], 28, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, NearestRank(tt.sorted, tt.p))
		})
	}
}
