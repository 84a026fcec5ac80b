package podcontract

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "$(A)"}
	for in, want := range map[string]string{
		"$(A)":          "1",
		"x$(A)y$(A)":    "x1y1",
		"$(B)":          "$(A)", // a value is not expanded twice
		"$(NOPE)":       "$(NOPE)",
		"$$(A)":         "$(A)",
		"$$$(A)":        "$1",
		"$$":            "$",
		"kill -TERM $$": "kill -TERM $",
		"$":             "$",
		"a$":            "a$",
		"$x ${A}":       "$x ${A}",
		"$(A":           "$(A",
		"$(":            "$(",
		"$()":           "$()",
	} {
		assert.Equal(t, want, Expand(in, vars), "%q", in)
	}
}
