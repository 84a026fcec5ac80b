// Package suggest finds the name a person most likely meant, for "did you mean" hints in the
// messages the plugin and the operator write for pipeline authors.
package suggest

import "strings"

// Nearest returns the name among known closest to got, ignoring case, if its edit distance
// is at most limit; "" when none is that close or got is itself known.
func Nearest(got string, known []string, limit int) string {
	best, bestDist := "", limit+1
	lower := strings.ToLower(got)
	for _, k := range known {
		if k == got {
			return ""
		}
		if d := Distance(lower, strings.ToLower(k)); d < bestDist || (d == bestDist && best != "" && k < best) {
			best, bestDist = k, d
		}
	}
	return best
}

// Distance is the Levenshtein distance between a and b, by bytes (the names compared are
// ASCII): the fewest insertions, deletions and substitutions that turn a into b.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
