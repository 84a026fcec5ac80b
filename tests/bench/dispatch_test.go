package bench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/dispatchbench"
)

// TestDispatchCheck runs the bench's short dispatch check (-dispatch check) as `make
// bench` runs the full one: the spawner on envtest, the fake Buildkite, no kwok. It
// asserts that streaming took every job from the push and that the table and the JSON
// have the figures, not how fast anything was.
func TestDispatchCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, err := StartDispatcher()
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.Close()) }()
	res, err := d.Run(ctx, DispatchCheck, t.Logf)
	require.NoError(t, err, "streaming took every job from the push")

	require.Len(t, res.PingModes, 1)
	m := res.PingModes[0]
	assert.Equal(t, spawner.PingModeAuto, m.PingMode)
	assert.Equal(t, dispatchbench.Short.Jobs, m.Samples)
	assert.Len(t, m.Waits, m.Samples)
	assert.Zero(t, m.FromPing)
	assert.Positive(t, m.P50)
	assert.LessOrEqual(t, m.P50, m.P90)
	assert.LessOrEqual(t, m.P90, m.P99)
	assert.Equal(t, m.Max, m.P99, "with 5 jobs p99 is the slowest")

	var out strings.Builder
	PrintDispatch(&out, []*DispatchResult{res})
	t.Log("\n" + out.String())
	assert.Contains(t, out.String(), "| dispatch → accepted, ping interval 10 s, 8 slots, 5 jobs 0.5-1.5 s apart | p50 | p90 | p99 |")
	assert.Contains(t, out.String(), "| streaming (`--ping-mode auto`) | ")

	data, err := json.Marshal(res)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(data, &back))
	assert.Equal(t, ModeDispatch, back["mode"])
	assert.Equal(t, BackendEnvtest, back["backend"])
	assert.Contains(t, string(data), `"ping_interval_seconds":10`)
	assert.Contains(t, string(data), `"dispatch_to_accepted_ms":[`)
}

func TestPrintDispatch(t *testing.T) {
	run := func(load float64, polling, streaming DispatchMode) *DispatchResult {
		return &DispatchResult{
			Backend: BackendEnvtest, Mode: ModeDispatch,
			Machine:   Machine{CPUs: 2, Commit: "abc1234", LoadBefore: load, LoadAfter: load + 1},
			Setup:     DispatchSetup{Description: dispatchbench.Full.String(), Jobs: 20},
			PingModes: []DispatchMode{polling, streaming},
		}
	}
	poll := func(p50, p90, p99 float64) DispatchMode {
		return DispatchMode{PingMode: spawner.PingModePingOnly, Samples: 20, P50: p50, P90: p90, P99: p99, FromPing: 20}
	}
	stream := func(p50, p90, p99 float64, fromPing int) DispatchMode {
		return DispatchMode{PingMode: spawner.PingModeAuto, Samples: 20, P50: p50, P90: p90, P99: p99, FromPing: fromPing}
	}
	tests := []struct {
		name string
		runs []*DispatchResult
		want []string
	}{
		{"one run: its values", []*DispatchResult{run(3, poll(1220, 5180, 9450), stream(8, 16, 50, 0))}, []string{
			"envtest backend, the spawner in the bench's process, the fake Buildkite; 1 run(s)",
			"machine: 2 CPUs, load average 3.0 to 4.0 before and after the runs; abc1234",
			"percentiles by nearest rank (with 20 jobs, p99 is the slowest job)\n",
			"| dispatch → accepted, ping interval 10 s, 8 slots, 20 jobs 2-6 s apart | p50 | p90 | p99 |",
			"| polling (`--ping-mode ping-only`) | 1.22 s | 5.18 s | 9.45 s |",
			"| streaming (`--ping-mode auto`) | 8 ms | 16 ms | 50 ms |",
		}},
		{"three runs: min / median / max of each percentile on its own", []*DispatchResult{
			run(4, poll(1430, 6510, 9450), stream(10, 20, 60, 0)),
			run(6, poll(1220, 5730, 11860), stream(8, 16, 74, 0)),
			run(9, poll(1660, 5180, 10470), stream(10, 17, 50, 0)),
		}, []string{
			"3 run(s)",
			"load average 4.0 to 10.0",
			"; each cell is min / median / max across the runs",
			"| polling (`--ping-mode ping-only`) | 1.22 s / 1.43 s / 1.66 s | 5.18 s / 5.73 s / 6.51 s | 9.45 s / 10.47 s / 11.86 s |",
			"| streaming (`--ping-mode auto`) | 8 ms / 10 ms / 10 ms | 16 ms / 17 ms / 20 ms | 50 ms / 60 ms / 74 ms |",
		}},
		{"streaming jobs taken from a ping are said", []*DispatchResult{
			run(1, poll(1, 2, 3), stream(8, 16, 50, 0)),
			run(1, poll(1, 2, 3), stream(8, 16, 9000, 2)),
		}, []string{
			"| streaming (`--ping-mode auto`) — 2 of 40 jobs taken from a ping, not the push | ",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			PrintDispatch(&out, tt.runs)
			for _, w := range tt.want {
				assert.Contains(t, out.String(), w)
			}
		})
	}
	var none strings.Builder
	PrintDispatch(&none, nil)
	assert.Empty(t, none.String())
}
