package controller_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// A BuildJob that names another agent endpoint than the operator's (one made by hand, or
// admitted while the webhooks were off) does not make the controller send the job token
// there: the controller talks to its own endpoint only.
func TestJobTokenGoesOnlyToTheOperatorsEndpoint(t *testing.T) {
	w := newWorld(t, testOptions())
	elsewhere, err := fakebuildkite.Start(fakebuildkite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = elsewhere.Close() })

	j := w.acceptJob()
	// A job that fails before its pod: the controller itself starts, explains and
	// finishes it, with the job token.
	w.createBuildJob(j, gen.SetBuildJobAgentEndpoint(elsewhere.Endpoint()), gen.SetBuildJobEnvironment("no-such-env"))
	w.waitReported(j.name)

	ctx, cancel := context.WithTimeout(w.ctx, waitFor)
	defer cancel()
	snap, err := w.bk.WaitJob(ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
	require.NoError(t, err, "the job was not finished on the operator's Buildkite")
	assert.Equal(t, 1, snap.FinishCount)
	assert.Empty(t, elsewhere.Requests(), "requests to an endpoint the operator is not configured with")
}
