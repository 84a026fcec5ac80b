package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// spreadOf is the min, median and max of one figure across runs (the median of an even
// number of runs is the mean of the middle two).
type spreadOf struct{ min, median, max float64 }

func newSpread(vs []float64) spreadOf {
	if len(vs) == 0 {
		return spreadOf{}
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	mid := len(s) / 2
	med := s[mid]
	if len(s)%2 == 0 {
		med = (s[mid-1] + s[mid]) / 2
	}
	return spreadOf{min: s[0], median: med, max: s[len(s)-1]}
}

// Median is the median of vs (0 for none).
func Median(vs []float64) float64 { return newSpread(vs).median }

// row is one figure of the table: values reads it from a run (several values, such as
// p50, p95 and p99, share a cell), format writes one value.
type row struct {
	name   string
	values func(*Result) []float64
	format func(float64) string
}

// cells are the row's cells across runs: one value for one run, else the min, the
// median and the max, each value of the row taken across the runs on its own.
func (rw row) cells(runs []*Result) []string {
	per := make([][]float64, len(runs))
	width := 0
	for i, r := range runs {
		per[i] = rw.values(r)
		width = max(width, len(per[i]))
	}
	spreads := make([]spreadOf, width)
	for k := range width {
		var vs []float64
		for _, v := range per {
			if k < len(v) {
				vs = append(vs, v[k])
			}
		}
		spreads[k] = newSpread(vs)
	}
	cell := func(pick func(spreadOf) float64) string {
		parts := make([]string, len(spreads))
		for k, s := range spreads {
			parts[k] = rw.format(pick(s))
		}
		return strings.Join(parts, " / ")
	}
	if len(runs) == 1 {
		return []string{cell(func(s spreadOf) float64 { return s.min })}
	}
	return []string{
		cell(func(s spreadOf) float64 { return s.min }),
		cell(func(s spreadOf) float64 { return s.median }),
		cell(func(s spreadOf) float64 { return s.max }),
	}
}

// ms writes milliseconds in readable units.
func ms(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func fixed(digits int) func(float64) string {
	return func(v float64) string { return fmt.Sprintf("%.*f", digits, v) }
}

func mib(v float64) string { return fmt.Sprintf("%.1f MiB", v) }

func percent(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }

func one(f func(*Result) float64) func(*Result) []float64 {
	return func(r *Result) []float64 { return []float64{f(r)} }
}

func p50p95p99(s Stats) []float64 { return []float64{s.P50, s.P95, s.P99} }

// names are the names in the runs' lists, in the first run's order, then the others'.
func names(runs []*Result, list func(*Result) []string) []string {
	var out []string
	for _, r := range runs {
		for _, n := range list(r) {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}
