package handoff_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	a := handoff.PodRef{Namespace: "ns", Name: "warm-a", UID: "uid-a"}
	aAgain := handoff.PodRef{Namespace: "ns", Name: "warm-a", UID: "uid-a2"} // deleted and made again
	aElsewhere := handoff.PodRef{Namespace: "other", Name: "warm-a", UID: "uid-a"}
	b := handoff.PodRef{Namespace: "ns", Name: "warm-b", UID: "uid-b"}
	job := handoffclient.Job{ID: "job-1", Token: "tok"}

	r := handoff.NewRegistry()
	_, err := r.Claim(ctx, a)
	require.ErrorIs(t, err, handoff.ErrNotReady, "before the first sync an unknown pod is asked to come back")
	r.MarkReady()
	_, err = r.Claim(ctx, a)
	require.ErrorIs(t, err, handoff.ErrUnknownPod)
	assert.Nil(t, r.Changed(a), "an unknown pod has nothing to wait for")

	require.ErrorContains(t, r.Register(handoff.PodRef{Namespace: "ns", Name: "x"}), "UID")
	require.ErrorContains(t, r.Assign(handoff.PodRef{Namespace: "ns", Name: "x"}, job), "UID")

	require.NoError(t, r.Register(a))
	require.NoError(t, r.Register(a), "registering twice changes nothing")
	assert.Equal(t, handoff.StateWaiting, r.State(a))
	_, err = r.Claim(ctx, a)
	require.ErrorIs(t, err, handoff.ErrNotAssigned)

	changed := r.Changed(a)
	assert.False(t, closed(changed))
	require.NoError(t, r.Assign(a, job))
	assert.True(t, closed(changed), "an assignment wakes the pod's long poll")
	assert.Equal(t, handoff.StateAssigned, r.State(a))
	require.ErrorIs(t, r.Assign(a, handoffclient.Job{ID: "job-2"}), handoff.ErrAlreadyAssigned, "one job per pod")

	for _, other := range []handoff.PodRef{aAgain, aElsewhere, b} {
		_, err = r.Claim(ctx, other)
		require.ErrorIs(t, err, handoff.ErrUnknownPod, "%s is not %s", other, a)
	}

	got, err := r.Claim(ctx, a)
	require.NoError(t, err)
	assert.Equal(t, job, got)
	assert.Equal(t, handoff.StateHandedOff, r.State(a))
	_, err = r.Claim(ctx, a)
	require.ErrorIs(t, err, handoff.ErrAlreadyHandedOff, "a job is handed off once")
	require.ErrorIs(t, r.Assign(a, handoffclient.Job{ID: "job-3"}), handoff.ErrAlreadyAssigned, "a warm pod is single-use")

	// Assign registers a pod it did not know; Forget tells what became of it.
	require.NoError(t, r.Assign(b, handoffclient.Job{ID: "job-b"}))
	changed = r.Changed(b)
	assert.Equal(t, handoff.StateAssigned, r.Forget(b), "b's job was never handed off: it can start elsewhere")
	assert.True(t, closed(changed), "a forgotten pod's long poll wakes to its refusal")
	_, err = r.Claim(ctx, b)
	require.ErrorIs(t, err, handoff.ErrUnknownPod)
	assert.Equal(t, handoff.StateHandedOff, r.Forget(a))
	assert.Equal(t, handoff.StateUnknown, r.Forget(a))
}
