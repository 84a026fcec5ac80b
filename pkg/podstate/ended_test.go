package podstate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

func TestEnded(t *testing.T) {
	cases := []struct {
		fixture string
		// kinds is nil for a pod that goes on.
		kinds      []podstate.EndKind
		disruption podstate.DisruptionKind // "" for none
		exitCode   int32                   // the job container's, when it ended
		failedInit string
	}{
		{fixture: "unschedulable"},
		{fixture: "image-pull-backoff"},
		{fixture: "running"},
		{fixture: "preempted"},     // still stopping
		{fixture: "taint-manager"}, // deleted, and nobody left to stop it
		{fixture: "exited", kinds: []podstate.EndKind{podstate.EndJobEnded}},
		{fixture: "oom-killed", kinds: []podstate.EndKind{podstate.EndOOMKilled, podstate.EndJobEnded}, exitCode: 137},
		{
			fixture: "evicted-node-pressure", kinds: []podstate.EndKind{podstate.EndDisrupted, podstate.EndEvicted, podstate.EndJobEnded},
			disruption: podstate.NodePressure, exitCode: 143,
		},
		{fixture: "evicted-storage-limit", kinds: []podstate.EndKind{podstate.EndEvicted, podstate.EndJobEnded}, exitCode: 137},
		{fixture: "evicted-storage-limit-no-condition", kinds: []podstate.EndKind{podstate.EndEvicted, podstate.EndJobEnded}, exitCode: 137},
		{fixture: "evicted-by-api", kinds: []podstate.EndKind{podstate.EndDisrupted, podstate.EndJobEnded}, disruption: podstate.EvictedByAPI, exitCode: 143},
		{fixture: "node-shutdown", kinds: []podstate.EndKind{podstate.EndDisrupted, podstate.EndJobEnded}, disruption: podstate.NodeShutdown, exitCode: 143},
		{fixture: "pod-gc", kinds: []podstate.EndKind{podstate.EndDisrupted, podstate.EndPodFailed}, disruption: podstate.NodeDeleted},
		{fixture: "node-lost", kinds: []podstate.EndKind{podstate.EndUnknown}, disruption: podstate.NodeLost},
		{fixture: "deadline-exceeded", kinds: []podstate.EndKind{podstate.EndDeadlineExceeded, podstate.EndJobEnded}, exitCode: 137},
		{fixture: "init-failed", kinds: []podstate.EndKind{podstate.EndInitFailed, podstate.EndPodFailed}, failedInit: "agentd-install"},
	}
	for _, tc := range cases {
		t.Run(tc.fixture, func(t *testing.T) {
			pod, _ := fixture(t, tc.fixture)
			end := podstate.Ended(pod)
			if tc.kinds == nil {
				assert.Nil(t, end)
				return
			}
			require.NotNil(t, end)
			assert.Equal(t, tc.kinds, end.Kinds)
			assert.Equal(t, tc.kinds[0], end.Kind())
			assert.Equal(t, pod.Status.Reason, end.Reason)
			assert.Equal(t, pod.Status.Message, end.Message)
			if tc.disruption == "" {
				assert.Nil(t, end.Disruption)
			} else if assert.NotNil(t, end.Disruption) {
				assert.Equal(t, tc.disruption, end.Disruption.Kind)
			}
			if end.Has(podstate.EndJobEnded) {
				require.NotNil(t, end.Job)
				assert.Equal(t, tc.exitCode, end.Job.ExitCode)
			} else {
				assert.Nil(t, end.Job)
			}
			if tc.failedInit == "" {
				assert.Nil(t, end.FailedInit)
			} else if assert.NotNil(t, end.FailedInit) {
				assert.Equal(t, tc.failedInit, end.FailedInit.Name)
				assert.NotZero(t, end.FailedInit.Terminated.ExitCode)
			}
		})
	}
}

// Phases the fixtures do not show: a pod that succeeded without a job container status,
// and one whose node stopped reporting it without saying more.
func TestEndedWithoutAWord(t *testing.T) {
	succeeded := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	end := podstate.Ended(succeeded)
	require.NotNil(t, end)
	assert.Equal(t, []podstate.EndKind{podstate.EndNoJobStatus}, end.Kinds)

	unknown := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: corev1.PodUnknown}}
	end = podstate.Ended(unknown)
	require.NotNil(t, end)
	assert.Equal(t, []podstate.EndKind{podstate.EndUnknown}, end.Kinds)
	require.NotNil(t, end.Disruption, "a pod whose node says nothing is lost")
	assert.Equal(t, podstate.NodeLost, end.Disruption.Kind)
	assert.Equal(t, "node-1", end.Disruption.Node)
	assert.Empty(t, end.Disruption.Message)
	assert.False(t, end.Disruption.Graceful)
}
