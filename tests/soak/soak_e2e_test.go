package soak

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// TestChaosSoak is the short soak: 36 jobs through the operator on the local node, many of
// them in warm pods, while it is killed, its job pods and idle warm pods deleted, and
// Buildkite and the API server fail (see the package doc). No job may be lost, doubled, stuck or left with a hole in its log. `make
// soak` runs the full one; `make test-e2e` (and so CI) runs this one. By hand:
// `E2E=1 go test -v -run TestChaosSoak ./tests/soak/` (root).
func TestChaosSoak(t *testing.T) {
	if os.Getenv("E2E") != "1" {
		t.Skip("the chaos soak runs on a real local node: run `make test-e2e` (sets E2E=1; needs root) or `make soak`")
	}
	require.Zero(t, os.Geteuid(), "the soak starts a local Kubernetes node: run it as root")
	dir, err := os.MkdirTemp("", "bk-operator-soak-")
	require.NoError(t, err)
	agentd := os.Getenv("E2E_AGENTD")
	if agentd == "" {
		agentd = filepath.Join(dir, "agentd")
		build := exec.Command("go", "build", "-o", agentd, "./cmd/agentd")
		build.Dir = testkit.RepoRoot()
		out, err := build.CombinedOutput()
		require.NoError(t, err, "building agentd: %s", out)
	}
	cfg := DefaultConfig(36)
	cfg.Slots = 6
	cfg.Timeout = 15 * time.Minute
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Dir, cfg.Agentd, cfg.Logf = dir, agentd, t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	require.NoError(t, err, "logs in %s", dir)
	t.Logf("seed %d\n%s", cfg.Seed, res.Table())
	assert.False(t, res.Audit.Failed(), "%s", res.Audit)
	// The chaos happened: a soak without faults proves nothing.
	assert.Positive(t, res.Faults[FaultKill], "kills")
	assert.Positive(t, res.Faults[FaultPodDeleted], "pod deletions")
	assert.Positive(t, res.Faults[FaultBuildkite5xx]+res.Faults[FaultBuildkite429]+res.Faults[FaultBuildkiteDrop], "Buildkite faults")
	assert.Positive(t, res.Faults[FaultAPICut], "API server connection cuts")
	assert.Positive(t, res.WarmStarts, "jobs that started in warm pods, through the hand-off")
	if t.Failed() {
		t.Logf("kept %s: the operator's log (node/agentd-operator.log) and the local node's state", dir)
	} else {
		_ = os.RemoveAll(dir)
	}
}
