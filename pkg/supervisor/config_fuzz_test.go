package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// FuzzConfigFromEnv reads the supervisor's settings from an environment that a
// BuildEnvironment and a pipeline shape: whatever the values, no panic, and a config read
// without error holds usable numbers (sizes above 0, no negative or overflowed durations).
// The seed corpus is in testdata/fuzz/FuzzConfigFromEnv.
func FuzzConfigFromEnv(f *testing.F) {
	f.Add("102400", "1", "0.5", "9", "/a.log; /b.log;", "Command")
	f.Add("0", "-1", "x", "", ";;", "Bootstrap")
	f.Add("99999999999", "1", "1", "1", "", "Command")
	f.Add("9999999999999999999", "1e300", "NaN", "Inf", " ", "")
	f.Fuzz(func(t *testing.T, chunk, interval, status, grace, logPaths, runner string) {
		env := []string{
			podcontract.EnvChunkMaxBytes + "=" + chunk,
			podcontract.EnvChunkInterval + "=" + interval,
			podcontract.EnvJobStatusInterval + "=" + status,
			podcontract.EnvSignalGrace + "=" + grace,
			podcontract.EnvLogPaths + "=" + logPaths,
			podcontract.EnvRunner + "=" + runner,
		}
		c, err := ConfigFromEnv(env)
		if err != nil {
			return
		}
		// A chunk buffer that size is allocated: a huge one would kill the supervisor.
		if c.ChunkMaxBytes <= 0 || c.ChunkMaxBytes > 64<<20 {
			t.Fatalf("chunk size %d from %q", c.ChunkMaxBytes, chunk)
		}
		for name, d := range map[string]time.Duration{"interval": c.ChunkInterval, "status": c.JobStatusInterval, "grace": c.SignalGrace} {
			if d < 0 || d > 24*time.Hour {
				t.Fatalf("%s is %v from %q %q %q", name, d, interval, status, grace)
			}
		}
		for _, p := range c.LogPaths {
			if p == "" || p != strings.TrimSpace(p) {
				t.Fatalf("log path %q from %q", p, logPaths)
			}
		}
	})
}
