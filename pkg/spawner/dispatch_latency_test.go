package spawner_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/dispatchbench"
)

// TestDispatchLatency checks that, streaming, slots take every job from the stream's push
// and none from a ping: 5 jobs arriving 0.5-1.5 s apart, Buildkite's ping interval of
// 10 s, 8 slots. It times nothing: the bench measures dispatch → accepted, polling and
// streaming side by side with the same code (tests/dispatchbench; `make bench`,
// docs/performance.md "Streaming dispatch").
func TestDispatchLatency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run, err := dispatchbench.Measure(ctx, env, dispatchbench.Short, spawner.PingModeAuto, testr.NewWithOptions(t, testr.Options{Verbosity: 0}))
	require.NoError(t, err)
	require.Len(t, run.Jobs, dispatchbench.Short.Jobs)
	require.NoError(t, run.Check())
	p := dispatchbench.Summarize(run.Waits())
	t.Logf("dispatch → accepted, streaming, %s: p50 %v, p90 %v, max %v",
		dispatchbench.Short, p.P50.Round(time.Millisecond), p.P90.Round(time.Millisecond), p.Max.Round(time.Millisecond))
}
