package spawner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestFailJobFinishesAnEndingJob fails a job at intake and cancels it in Buildkite while
// the spawner cannot yet get its finish through. A canceling job still waits for its
// finish: the spawner must send it, and the job ends canceled with the explanation in its
// log, instead of staying canceling for ever.
func TestFailJobFinishesAnEndingJob(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots, c.APIWaitScale = 1, 0.001 })
	// Every attempt of the first finish fails: the spawner retries the whole failure
	// later, after looking at the job's state again.
	attempts := agentapi.PolicyOf(agentapi.CallFinish).Attempts
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPFinish, Status: 502, Times: attempts})
	yaml := "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_BUILD_ENVIRONMENT: nope}\n"
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: yaml})
	require.NoError(t, err)
	jobID := b.Jobs[0]
	waitFor(t, fake, 30*time.Second, "the first finish to give up", func() bool {
		return fake.RequestCount(fakebuildkite.EPFinish, jobID) >= attempts
	})
	require.NoError(t, fake.CancelJob(jobID))
	j, _ := fake.Job(jobID)
	require.Equal(t, fakebuildkite.StateCanceling, j.State, "the job had started")

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	j, err = fake.WaitJob(ctx, jobID, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
	require.NoError(t, err, "the canceling job never got its finish")
	assert.Equal(t, fakebuildkite.StateCanceled, j.State)
	assert.Equal(t, 1, j.FinishCount)
	assert.Contains(t, fakebuildkite.PlainLog(j.Log), `BuildEnvironment "nope" does not exist`)
}
