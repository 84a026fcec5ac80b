package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// TestDemo runs the demo to completion against the suite's node, as `make demo
// USE_CURRENT_CONTEXT=1` would against a cluster someone already has: its own namespace,
// operator and fake Buildkite (on all interfaces, reached by the host's address), and its
// sample build must end as expected. `make demo` runs the full sample, pipeline upload
// included, on the local node.
func TestDemo(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", "run", "./tests/demo",
		"--kubeconfig", e.Kubeconfig, "--namespace", "demo", "--exit-when-done",
		"--agentd", e.Opts.Agentd, "--state", t.TempDir(), "--timeout", "5m")
	cmd.Dir = testkit.RepoRoot()
	out, err := cmd.CombinedOutput()
	recordTiming("demo against the node finished after %s", time.Since(start).Round(10*time.Millisecond))
	require.NoError(t, err, "the demo failed:\n%s", out)
	text := string(out)
	assert.Contains(t, text, "every step ended as expected")
	assert.NotContains(t, text, "UNEXPECTED")
	for _, step := range []string{"passes", "exits 3", "plugin options"} {
		assert.Contains(t, text, step)
	}
	// Against a cluster it did not start, the demo has no repository to give
	// buildkite-agent bootstrap unless told one (--repo); it says so.
	assert.Contains(t, text, "leaving out the pipeline upload step")
	assert.Contains(t, text, "get buildjobs,pods -n demo")
	assert.Contains(t, text, filepath.Base(e.Kubeconfig))
	if t.Failed() || testing.Verbose() {
		t.Logf("demo output ends:\n%s", tail(text, 25))
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
