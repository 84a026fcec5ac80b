package dispatchbench

import (
	"math"
	"slices"
	"time"
)

// Percentiles are a sample's p50, p90, p99 and max by nearest rank: the smallest value
// with at least p % of the sample at or below it. With 20 values p99 is the largest.
type Percentiles struct {
	Samples            int
	P50, P90, P99, Max time.Duration
}

// Summarize is sample's percentiles (all zero for none); sample is left as it is.
func Summarize(sample []time.Duration) Percentiles {
	if len(sample) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(sample)
	slices.Sort(s)
	return Percentiles{
		Samples: len(s),
		P50:     NearestRank(s, 50),
		P90:     NearestRank(s, 90),
		P99:     NearestRank(s, 99),
		Max:     s[len(s)-1],
	}
}

// NearestRank is the p-th percentile (0 < p ≤ 100) of sorted, which is not empty: the
// value at rank ⌈p × n / 100⌉.
func NearestRank(sorted []time.Duration, p float64) time.Duration {
	// p × n first: exact for whole p and n, where p/100 is not (0.07 × 100 is above 7, a rank too many).
	rank := int(math.Ceil(p * float64(len(sorted)) / 100))
	return sorted[min(max(rank, 1), len(sorted))-1]
}
