package supervisor

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestJobOverBeforeStart: a job canceled on Buildkite while its pod was starting may be
// finished already (the controller does that); the supervisor must not run its
// command or write to its log, and says so in its progress so that the controller does not
// report the job again. Buildkite refuses its start (422), which the supervisor sends beside
// its read of the job's state.
func TestJobOverBeforeStart(t *testing.T) {
	stateUnreadable := fakebuildkite.Fault{Endpoint: fakebuildkite.EPJobState, Status: http.StatusServiceUnavailable, Times: 1}
	tests := []struct {
		name string
		// faults are injected before the supervisor starts.
		faults []fakebuildkite.Fault
		// wantStarts is how many start requests reach the fake.
		wantStarts int
	}{
		{
			// The state is asked beside the start, not before it (one round trip less
			// before every command): Buildkite refuses the start of a canceled job.
			name:       "the job state says canceled: the start is refused",
			wantStarts: 1,
		},
		{
			// The fake refuses the start of a canceled job with 422, as Buildkite does.
			name:       "the job state cannot be read, and start answers 422",
			faults:     []fakebuildkite.Fault{stateUnreadable},
			wantStarts: 1,
		},
		{
			name:       "the job state cannot be read, and start answers 401",
			faults:     []fakebuildkite.Fault{stateUnreadable, {Endpoint: fakebuildkite.EPStart, Status: http.StatusUnauthorized}},
			wantStarts: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			marker := filepath.Join(t.TempDir(), "ran")
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("touch " + marker)})
			require.NoError(t, h.s.CancelJob(h.job.ID))
			for _, f := range tt.faults {
				h.s.Inject(f)
			}
			sv := h.start("--finish")
			assert.Equal(t, 0, sv.wait(t, 30*time.Second), "a job that is over is not the supervisor's failure")

			assert.NoFileExists(t, marker, "the command must not run")
			snap := h.snapshot()
			assert.Empty(t, snap.Log, "nothing is written to the log of a job that is over")
			assert.Equal(t, tt.wantStarts, h.s.RequestCount(fakebuildkite.EPStart, h.job.ID))
			assert.Zero(t, snap.FinishCount, "nor is it finished")
			p := h.readProgress()
			assert.True(t, p.EndedOnBuildkite)
			assert.Equal(t, "canceled", p.BuildkiteState, "the state is read again after a refused start, for the record")
			assert.False(t, p.Started)
			assert.Empty(t, p.Error, "nothing went wrong")
			assert.NotContains(t, sv.stderr.String(), "error")
		})
	}
}

// TestCancelingBeforeTheCommandStarts: a job that Buildkite is canceling (it was started,
// then canceled, before the supervisor got to run it) waits for a finish: the command does
// not run, and the job ends as canceled.
func TestCancelingBeforeTheCommandStarts(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline("touch " + marker)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, agentapi.New(agentapi.Config{Endpoint: h.s.Endpoint(), Token: h.job.Token}).Start(ctx, h.job.ID, time.Now()))
	require.NoError(t, h.s.CancelJob(h.job.ID))
	require.Equal(t, fakebuildkite.StateCanceling, h.snapshot().State)

	assert.Equal(t, 1, h.start("--finish").wait(t, 30*time.Second))
	assert.NoFileExists(t, marker, "the command must not run")
	snap := h.snapshot()
	assert.Equal(t, fakebuildkite.StateCanceled, snap.State)
	assert.Equal(t, "-1", snap.ExitStatus)
	assert.Equal(t, agentapi.SignalReasonCancel, snap.SignalReason)
	assert.Contains(t, fakebuildkite.PlainLog(snap.Log), "canceled on Buildkite before its command started")
	p := h.readProgress()
	assert.True(t, p.Started && p.Exited && p.Flushed)
	assert.Equal(t, agentapi.SignalReasonCancel, p.SignalReason)
	assert.False(t, p.EndedOnBuildkite, "Buildkite still waits for this job's finish")
}
