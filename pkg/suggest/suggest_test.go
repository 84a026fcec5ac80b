package suggest

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDistance(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"go", "", 2},
		{"", "go", 2},
		{"go-1-26", "go-1-26", 0},
		{"go-1-25", "go-1-26", 1},
		{"kitten", "sitting", 3},
		{"default", "defualt", 2},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, Distance(tc.a, tc.b), "%q -> %q", tc.a, tc.b)
		assert.Equal(t, tc.want, Distance(tc.b, tc.a), "symmetric: %q -> %q", tc.b, tc.a)
	}
}

func TestNearest(t *testing.T) {
	known := []string{"default", "go-1-26", "go-1-25", "large"}
	cases := []struct {
		got   string
		limit int
		want  string
	}{
		{"go-1-24", 2, "go-1-25"}, // distance 1 to go-1-25 and 2 to go-1-26
		{"GO-1-26", 2, "go-1-26"}, // case does not count
		{"default", 2, ""},        // known: nothing to suggest
		{"python", 2, ""},         // nothing close
		{"larg", 1, "large"},      // within the limit
		{"lrg", 1, ""},            // beyond it
		{"go-1-2", 3, "go-1-25"},  // a tie goes to the first in sorted order
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, Nearest(tc.got, known, tc.limit), "%q", tc.got)
	}
}
