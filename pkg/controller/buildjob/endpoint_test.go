package buildjob_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
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

// Without the webhooks nothing refuses a BuildJob that names another endpoint when it is
// made, so the controller does not build its pod: the pod would send the job token there.
// The job fails, reported to the operator's own Buildkite.
func TestNoPodForAnEndpointNotAllowed(t *testing.T) {
	w := newWorld(t, testOptions())
	elsewhere, err := fakebuildkite.Start(fakebuildkite.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = elsewhere.Close() })

	j := w.acceptJob()
	w.createBuildJob(j, gen.SetBuildJobAgentEndpoint(elsewhere.Endpoint()))
	bj := w.waitReported(j.name)
	fin := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionFinished)
	require.NotNil(t, fin)
	assert.Equal(t, bkv1.ReasonInvalidPod, fin.Reason)
	assert.Contains(t, bj.Status.Message, "--allowed-agent-endpoints")
	err = w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: j.name}, &corev1.Pod{})
	assert.True(t, apierrors.IsNotFound(err), "a pod was made: %v", err)
	snap := w.bkSnapshot(j.id)
	assert.Equal(t, 1, snap.FinishCount)
	assert.Equal(t, "-1", snap.ExitStatus)
	assert.Empty(t, elsewhere.Requests(), "requests to an endpoint the operator does not allow")
}
