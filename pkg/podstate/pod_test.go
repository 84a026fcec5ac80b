package podstate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

func TestPodFacts(t *testing.T) {
	cases := []struct {
		fixture         string
		stopped, ran    bool
		scheduled, runs bool
		scheduledSince  string
	}{
		{fixture: "unschedulable", stopped: true, scheduledSince: "12:00:00"},
		{fixture: "image-pull-backoff", scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "failed-mount", scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "invalid-image", stopped: true, scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "never-pull", stopped: true, scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "running", ran: true, runs: true, scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "preempted", ran: true, runs: true, scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "exited", stopped: true, ran: true, scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "init-failed", stopped: true, scheduled: true, scheduledSince: "12:00:01"},
		{fixture: "pod-gc", stopped: true, ran: true, runs: true, scheduled: true, scheduledSince: "12:00:01"},
	}
	for _, tc := range cases {
		t.Run(tc.fixture, func(t *testing.T) {
			pod, _ := fixture(t, tc.fixture)
			assert.Equal(t, tc.stopped, podstate.Stopped(pod), "stopped")
			assert.Equal(t, tc.ran, podstate.JobRan(pod), "ran")
			assert.Equal(t, tc.runs, podstate.JobRunning(pod) != nil, "runs")
			assert.Equal(t, tc.scheduled, podstate.Scheduled(pod), "scheduled")
			assert.Equal(t, at(t, tc.scheduledSince), podstate.ScheduledSince(pod).UTC())
		})
	}
}

// A pod whose command never started is stopped once its deletion has no grace left: the
// kubelet starts no container then.
func TestStoppedOnceItsDeletionHasNoGrace(t *testing.T) {
	pod, _ := fixture(t, "failed-mount")
	require.False(t, podstate.Stopped(pod))
	deleted := pod.DeepCopy()
	now := at(t, "12:05:00")
	ts := metav1.NewTime(now)
	deleted.DeletionTimestamp = &ts
	grace := int64(30)
	deleted.DeletionGracePeriodSeconds = &grace
	assert.False(t, podstate.Stopped(deleted), "still within its grace")
	grace = 0
	assert.True(t, podstate.Stopped(deleted), "its grace is over")
}

func TestSignalAndTerminationReason(t *testing.T) {
	cases := []struct {
		name   string
		term   corev1.ContainerStateTerminated
		signal string
		reason string
	}{
		{name: "exit 0", term: corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}},
		{name: "exit 1", term: corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}},
		{name: "SIGKILL by the shell's convention", term: corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}, signal: "SIGKILL"},
		{name: "SIGTERM", term: corev1.ContainerStateTerminated{ExitCode: 143, Reason: "Error"}, signal: "SIGTERM"},
		{name: "OOM", term: corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}, signal: "SIGKILL", reason: "OOMKilled"},
		{name: "the runtime's own signal", term: corev1.ContainerStateTerminated{ExitCode: 0, Signal: 11}, signal: "SIGSEGV"},
		{name: "a signal without a name", term: corev1.ContainerStateTerminated{Signal: 30}, signal: "signal 30"},
		{name: "exit 200 is no signal", term: corev1.ContainerStateTerminated{ExitCode: 200, Reason: "Error"}},
		{name: "the runtime could not start it", term: corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError"}, reason: "StartError"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.signal, podstate.Signal(&tc.term))
			assert.Equal(t, tc.reason, podstate.TerminationReason(&tc.term))
		})
	}
}
