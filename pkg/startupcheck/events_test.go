package startupcheck

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// A message longer than the API server's recorders keep is cut on a rune boundary, and
// the cut is marked.
func TestTruncate(t *testing.T) {
	cases := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"short enough", "queue paused", 20, "queue paused"},
		{"exactly n", "abcdef", 6, "abcdef"},
		{"cut", "abcdefghij", 8, "abcde..."},
		{"not inside a rune", "abcéfgh", 7, "abc..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.s, tc.n)
			assert.Equal(t, tc.want, got)
			assert.LessOrEqual(t, len(got), tc.n)
			assert.True(t, utf8.ValidString(got))
		})
	}
	long := truncate(strings.Repeat("é", maxEventMessage), maxEventMessage)
	assert.LessOrEqual(t, len(long), maxEventMessage)
	assert.True(t, strings.HasSuffix(long, "..."))
	assert.True(t, utf8.ValidString(long))
}
