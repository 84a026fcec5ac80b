package memlimit

import (
	"flag"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// --memory-limit (the chart gives it the container's limit) sets the collector's soft
// limit to 90% of it less 32 MiB, at least half of it, unless GOMEMLIMIT says otherwise;
// by default there is none.
func TestMemoryLimit(t *testing.T) {
	initial := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(initial)
	cases := []struct {
		name      string
		args      []string
		env       map[string]string
		gomemlim  string
		wantSoft  int64
		wantError string
	}{
		{name: "none by default"},
		{name: "a quantity", args: []string{"--memory-limit", "512Mi"}, wantSoft: 512<<20*9/10 - 32<<20},
		{name: "bytes from the variable, as the chart gives them", env: map[string]string{"BK_OPERATOR_MEMORY_LIMIT": "536870912"}, wantSoft: 512<<20*9/10 - 32<<20},
		{name: "a small limit keeps half", args: []string{"--memory-limit", "64Mi"}, wantSoft: 32 << 20},
		{name: "GOMEMLIMIT wins", args: []string{"--memory-limit", "512Mi"}, gomemlim: "300MiB"},
		{name: "0 is none", args: []string{"--memory-limit", "0"}},
		{name: "not a quantity", args: []string{"--memory-limit", "lots"}, wantError: `"lots" is not a quantity of bytes`},
		{name: "negative", args: []string{"--memory-limit", "-1Gi"}, wantError: "cannot be negative"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(initial)
			t.Setenv("GOMEMLIMIT", tc.gomemlim)
			var l Limit
			fs := flag.NewFlagSet("agentd operator", flag.ContinueOnError)
			l.BindFlags(fs)
			err := flagenv.ParseEnv(fs, tc.args, func(k string) string { return tc.env[k] })
			if tc.wantError != "" {
				require.ErrorContains(t, err, tc.wantError)
				return
			}
			require.NoError(t, err)
			soft := l.Apply()
			assert.Equal(t, tc.wantSoft, soft)
			want := initial
			if tc.wantSoft > 0 {
				want = tc.wantSoft
			}
			assert.Equal(t, want, debug.SetMemoryLimit(-1))
		})
	}
}
