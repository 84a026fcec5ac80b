package podstate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// wantDisruption is what a test expects of Disrupted; a zero kind: no disruption.
type wantDisruption struct {
	kind     podstate.DisruptionKind
	reason   string
	msg      string // a part of the message
	resource string
	node     string
	since    string // "" for none
	graceful bool
}

func checkDisruption(t *testing.T, d *podstate.Disruption, want wantDisruption) {
	t.Helper()
	if want.kind == "" {
		assert.Nil(t, d)
		return
	}
	require.NotNil(t, d)
	since := ""
	if !d.Since.IsZero() {
		since = d.Since.UTC().Format("15:04:05")
	}
	assert.Contains(t, d.Message, want.msg)
	assert.Equal(t, want, wantDisruption{
		kind: d.Kind, reason: d.Reason, msg: want.msg, resource: d.Resource, node: d.Node, since: since, graceful: d.Graceful,
	})
}

func TestDisrupted(t *testing.T) {
	cases := []struct {
		fixture string
		want    wantDisruption
	}{
		{fixture: "running"},
		{fixture: "oom-killed"},
		{fixture: "deadline-exceeded"},
		{fixture: "init-failed"},
		{fixture: "evicted-storage-limit"},
		{fixture: "evicted-storage-limit-no-condition"},
		{fixture: "preempted", want: wantDisruption{
			kind: podstate.Preempted, reason: "PreemptionByScheduler", graceful: true, node: "node-1", since: "12:04:10",
			msg: "default-scheduler: preempting to accommodate a higher priority pod",
		}},
		{fixture: "evicted-by-api", want: wantDisruption{
			kind: podstate.EvictedByAPI, reason: "EvictionByEvictionAPI", graceful: true, node: "node-1", since: "12:04:10", msg: "Eviction API: evicting",
		}},
		{fixture: "taint-manager", want: wantDisruption{
			kind: podstate.NodeTainted, reason: "DeletionByTaintManager", node: "node-1", since: "12:10:00", msg: "NoExecute taint",
		}},
		{fixture: "pod-gc", want: wantDisruption{
			kind: podstate.NodeDeleted, reason: "DeletionByPodGC", node: "node-1", since: "12:11:40", msg: "PodGC: node no longer exists",
		}},
		{fixture: "evicted-node-pressure", want: wantDisruption{
			kind: podstate.NodePressure, reason: "TerminationByKubelet", graceful: true, node: "node-1", since: "12:03:10",
			msg: "The node was low on resource: memory. Threshold quantity: 100Mi", resource: "memory",
		}},
		{fixture: "node-shutdown", want: wantDisruption{
			kind: podstate.NodeShutdown, reason: "TerminationByKubelet", graceful: true, node: "node-1", since: "12:05:20",
			msg: "Pod was terminated in response to imminent node shutdown.",
		}},
		{fixture: "node-lost", want: wantDisruption{
			kind: podstate.NodeLost, reason: "NodeLost", node: "node-1", msg: "Node node-1 which was running pod",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.fixture, func(t *testing.T) {
			pod, _ := fixture(t, tc.fixture)
			checkDisruption(t, podstate.Disrupted(pod), tc.want)
		})
	}
}

// What the fixtures do not show: a pod ended without the DisruptionTarget condition (a
// kubelet or controller that does not set it), a condition that is not True, and reasons
// this package does not know.
func TestDisruptedWithoutTheCondition(t *testing.T) {
	target := func(status corev1.ConditionStatus, reason, msg string) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: status, Reason: reason, Message: msg}}
	}
	cases := []struct {
		name     string
		status   corev1.PodStatus
		nodeName string
		want     wantDisruption
	}{
		{
			name:   "evicted under pressure",
			status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 9Gi. "},
			want:   wantDisruption{kind: podstate.NodePressure, reason: "Evicted", resource: "ephemeral-storage", msg: "low on resource", graceful: true},
		},
		{
			name:   "evicted under pressure, the resource unsaid",
			status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: "},
			want:   wantDisruption{kind: podstate.NodePressure, reason: "Evicted", msg: "low on resource", graceful: true},
		},
		{
			name:   "node shutdown",
			status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Terminated", Message: "Pod was terminated in response to imminent node shutdown."},
			want:   wantDisruption{kind: podstate.NodeShutdown, reason: "Terminated", msg: "imminent node shutdown", graceful: true},
		},
		{
			name:   "terminated for another reason",
			status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Terminated", Message: "Pod was terminated."},
		},
		{
			name:   "condition False",
			status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: target(corev1.ConditionFalse, "PreemptionByScheduler", "")},
		},
		{
			name:   "a reason of the future",
			status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: target(corev1.ConditionTrue, "DeletionByFuture", "future: deleting")},
			want:   wantDisruption{kind: podstate.OtherDisruption, reason: "DeletionByFuture", msg: "future: deleting", graceful: true},
		},
		{
			name:     "the kubelet, for pressure, while its containers stop",
			status:   corev1.PodStatus{Phase: corev1.PodRunning, Conditions: target(corev1.ConditionTrue, "TerminationByKubelet", "The node was low on resource: pids. ")},
			nodeName: "node-2",
			want:     wantDisruption{kind: podstate.NodePressure, reason: "TerminationByKubelet", resource: "pids", node: "node-2", msg: "low on resource: pids", graceful: true},
		},
		{
			name:   "unscheduled and lost",
			status: corev1.PodStatus{Phase: corev1.PodUnknown},
			want:   wantDisruption{kind: podstate.NodeLost},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: tc.nodeName}, Status: tc.status}
			checkDisruption(t, podstate.Disrupted(pod), tc.want)
		})
	}
}
