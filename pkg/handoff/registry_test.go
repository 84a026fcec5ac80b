package handoff_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

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

// TestRegistryWithdraw: only a job assigned by this process and not yet claimed can be
// taken back; anything else is left as it was, for the caller to handle the pod as any
// job pod that dies.
func TestRegistryWithdraw(t *testing.T) {
	ctx := context.Background()
	pod := handoff.PodRef{Namespace: "ns", Name: "warm-a", UID: "uid-a"}
	job := handoffclient.Job{ID: "job-1", Token: "tok"}
	cases := []struct {
		name      string
		setup     func(t *testing.T, r *handoff.Registry)
		withdrawn bool
		after     handoff.State
	}{
		{"assigned, not claimed", func(t *testing.T, r *handoff.Registry) {
			require.NoError(t, r.Assign(pod, job))
		}, true, handoff.StateUnknown},
		{"claimed", func(t *testing.T, r *handoff.Registry) {
			require.NoError(t, r.Assign(pod, job))
			_, err := r.Claim(ctx, pod)
			require.NoError(t, err)
		}, false, handoff.StateHandedOff},
		{"offered again after a restart, not claimed since", func(t *testing.T, r *handoff.Registry) {
			require.NoError(t, r.Reoffer(pod, job))
		}, false, handoff.StateAssigned},
		{"waiting for a job", func(t *testing.T, r *handoff.Registry) {
			require.NoError(t, r.Register(pod))
		}, false, handoff.StateWaiting},
		{"not known", func(*testing.T, *handoff.Registry) {}, false, handoff.StateUnknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := handoff.NewRegistry()
			r.MarkReady()
			tc.setup(t, r)
			changed := r.Changed(pod)
			assert.Equal(t, tc.withdrawn, r.Withdraw(pod))
			assert.Equal(t, tc.after, r.State(pod))
			if !tc.withdrawn {
				return
			}
			assert.True(t, closed(changed), "the pod's long poll wakes to its refusal")
			_, err := r.Claim(ctx, pod)
			require.ErrorIs(t, err, handoff.ErrUnknownPod, "a withdrawn job is not handed out")
			assert.False(t, r.Withdraw(pod), "a job is withdrawn once")
		})
	}
}

// TestRegistryWithdrawRacesClaim: a pod's supervisor claiming its job as the controller
// withdraws it (the pod is dying) gets it or is refused, and the withdrawal fails exactly
// when the claim succeeds: the job never both runs in the dying pod and starts elsewhere,
// nor in neither. Run with -race.
func TestRegistryWithdrawRacesClaim(t *testing.T) {
	ctx := context.Background()
	r := handoff.NewRegistry()
	r.MarkReady()
	const rounds = 2000
	var claimedCount, withdrawnCount int
	for i := range rounds {
		pod := handoff.PodRef{Namespace: "ns", Name: fmt.Sprintf("warm-%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}
		require.NoError(t, r.Assign(pod, handoffclient.Job{ID: fmt.Sprintf("job-%d", i), Token: "tok"}))
		start := make(chan struct{})
		var claimed, withdrawn bool
		var claimErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, claimErr = r.Claim(ctx, pod)
			claimed = claimErr == nil
		}()
		go func() {
			defer wg.Done()
			<-start
			withdrawn = r.Withdraw(pod)
		}()
		close(start)
		wg.Wait()
		require.NotEqual(t, claimed, withdrawn, "round %d: claimed %t, withdrawn %t (claim: %v)", i, claimed, withdrawn, claimErr)
		if withdrawn {
			require.ErrorIs(t, claimErr, handoff.ErrUnknownPod, "round %d", i)
			withdrawnCount++
		} else {
			claimedCount++
		}
		r.Forget(pod)
	}
	t.Logf("%d rounds: the claim won %d, the withdrawal %d", rounds, claimedCount, withdrawnCount)
}
