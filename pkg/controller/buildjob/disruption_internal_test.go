package buildjob

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
)

func TestPodDisruption(t *testing.T) {
	target := func(status corev1.ConditionStatus, reason, msg string) corev1.PodCondition {
		return corev1.PodCondition{Type: corev1.DisruptionTarget, Status: status, Reason: reason, Message: msg}
	}
	cases := []struct {
		name       string
		phase      corev1.PodPhase
		reason     string // the pod's status reason
		message    string // the pod's status message
		conditions []corev1.PodCondition
		// want is the Finished reason, "" for no disruption; what must be in its words.
		want   string
		what   []string
		signal string
	}{
		{name: "running, nothing said", phase: corev1.PodRunning},
		{
			name: "condition False", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionFalse, "PreemptionByScheduler", "")},
		},
		{
			name: "preempted", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "PreemptionByScheduler", "default-scheduler: preempting")},
			want:       bkv1.ReasonPreempted, what: []string{"preempted", "higher priority", "on node node-1", ": default-scheduler: preempting."}, signal: "SIGTERM",
		},
		{
			name: "evicted through the API", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "EvictionByEvictionAPI", "Eviction API: evicting")},
			want:       bkv1.ReasonEvicted, what: []string{"through the Eviction API", "Eviction API: evicting."}, signal: "SIGTERM",
		},
		{
			name: "taint manager", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")},
			want:       bkv1.ReasonNodeLost, what: []string{"node node-1 running the job's pod was lost", "NoExecute"}, signal: "SIGKILL",
		},
		{
			name: "pod GC", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "DeletionByPodGC", "PodGC: node no longer exists")},
			want:       bkv1.ReasonNodeDeleted, what: []string{"node node-1", "deleted from the cluster", "PodGC: node no longer exists."}, signal: "SIGKILL",
		},
		{
			name: "kubelet, node pressure, while the containers stop", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "TerminationByKubelet", "The node was low on resource: memory. Threshold quantity: 100Mi, available: 1Mi.")},
			want:       bkv1.ReasonNodePressure, what: []string{"node node-1 ran low on memory: The node was low on resource: memory. Threshold quantity: 100Mi, available: 1Mi."}, signal: "SIGTERM",
		},
		{
			name: "kubelet, node pressure, ended", phase: corev1.PodFailed, reason: "Evicted", message: "The node was low on resource: pids. ",
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "TerminationByKubelet", "The node was low on resource: pids. ")},
			want:       bkv1.ReasonNodePressure, what: []string{"ran low on pids"}, signal: "SIGTERM",
		},
		{
			name: "kubelet, node shutdown", phase: corev1.PodFailed, reason: "Terminated", message: "Pod was terminated in response to imminent node shutdown.",
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.")},
			want:       bkv1.ReasonNodeShutdown, what: []string{"node node-1 was shutting down", "imminent node shutdown."}, signal: "SIGTERM",
		},
		{
			name: "kubelet, over its own storage limit, marked all the same", phase: corev1.PodFailed, reason: "Evicted",
			message:    "Container job exceeded its local ephemeral storage limit \"1Gi\". ",
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "TerminationByKubelet", "Container job exceeded its local ephemeral storage limit \"1Gi\". ")},
		},
		{
			name: "a reason of the future", phase: corev1.PodRunning,
			conditions: []corev1.PodCondition{target(corev1.ConditionTrue, "DeletionByFuture", "")},
			want:       bkv1.ReasonDisrupted, what: []string{"(DisruptionTarget DeletionByFuture)."}, signal: "SIGTERM",
		},
		{
			name: "evicted under pressure, no condition", phase: corev1.PodFailed, reason: "Evicted", message: "The node was low on resource: ephemeral-storage.",
			want: bkv1.ReasonNodePressure, what: []string{"ran low on ephemeral-storage"}, signal: "SIGTERM",
		},
		{
			name: "evicted over its own storage limit, no condition", phase: corev1.PodFailed, reason: "Evicted",
			message: "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi.",
		},
		{
			name: "phase unknown", phase: corev1.PodUnknown,
			want: bkv1.ReasonNodeLost, what: []string{"was lost: its kubelet stopped reporting the pod's state."}, signal: "SIGKILL",
		},
		{
			name: "node lost, as the node controller said", phase: corev1.PodFailed, reason: "NodeLost", message: "Node node-1 which was running pod is unresponsive",
			want: bkv1.ReasonNodeLost, what: []string{"was lost: Node node-1 which was running pod is unresponsive."}, signal: "SIGKILL",
		},
		{
			name: "node shutdown, no condition", phase: corev1.PodFailed, reason: "Terminated", message: "Pod was terminated in response to imminent node shutdown.",
			want: bkv1.ReasonNodeShutdown, what: []string{"was shutting down"}, signal: "SIGTERM",
		},
		{
			name: "deadline exceeded is the job's own", phase: corev1.PodFailed, reason: "DeadlineExceeded",
			message: "Pod was active on the node longer than the specified deadline",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{
				Phase: tc.phase, Reason: tc.reason, Message: tc.message, Conditions: tc.conditions,
			}}
			d := podDisruption(pod)
			if tc.want == "" {
				assert.Nil(t, d)
				return
			}
			require.NotNil(t, d)
			assert.Equal(t, tc.want, d.reason)
			assert.Equal(t, tc.signal, d.signal)
			for _, w := range tc.what {
				assert.Contains(t, d.what, w)
			}
		})
	}
}

func TestDisrupted(t *testing.T) {
	d := &disruption{reason: bkv1.ReasonPreempted, what: "Kubernetes preempted the job's pod.", signal: "SIGTERM"}
	started := jobprogress.Progress{Started: true, Sequence: 2, Offset: 10}
	exitedWith := func(status int, signal, reason string, flushed bool) jobprogress.Progress {
		p := started
		p.Exited, p.ExitStatus, p.Signal, p.SignalReason, p.Flushed = true, status, signal, reason, flushed
		return p
	}
	cases := []struct {
		name     string
		progress jobprogress.Progress
		ran      bool

		reason, signal, signalReason string
		exitStatus                   int
		unknown                      bool
		explanation                  []string
		noExplanation                bool
	}{
		{
			name:   "never started",
			reason: bkv1.ReasonPreempted, exitStatus: -1, signalReason: agentapi.SignalReasonAgentStop,
			explanation: []string{"preempted", retryAdvice},
		},
		{
			name: "seen running, no record", ran: true,
			reason: bkv1.ReasonPreempted, exitStatus: -1, signal: "SIGTERM", signalReason: agentapi.SignalReasonAgentStop, unknown: true,
			explanation: []string{"preempted", retryAdvice},
		},
		{
			name: "killed mid-job", progress: started,
			reason: bkv1.ReasonPreempted, exitStatus: -1, signal: "SIGTERM", signalReason: agentapi.SignalReasonAgentStop,
			explanation: []string{"preempted", retryAdvice, "output may be missing"},
		},
		{
			name: "stopped by its supervisor", progress: exitedWith(-1, "SIGTERM", agentapi.SignalReasonAgentStop, true),
			reason: bkv1.ReasonPreempted, exitStatus: -1, signal: "SIGTERM", signalReason: agentapi.SignalReasonAgentStop,
			explanation: []string{"preempted", retryAdvice},
		},
		{
			name: "command stopped on SIGTERM by its own exit status", progress: exitedWith(143, "", agentapi.SignalReasonAgentStop, true),
			reason: bkv1.ReasonPreempted, exitStatus: 143, signalReason: agentapi.SignalReasonAgentStop,
			explanation: []string{"preempted", retryAdvice},
		},
		{
			name: "the command had exited", progress: exitedWith(3, "", "", false),
			reason: bkv1.ReasonExited, exitStatus: 3,
			explanation: []string{"preempted", "already ended"},
		},
		{
			name: "canceled on Buildkite first", progress: exitedWith(-1, "SIGTERM", agentapi.SignalReasonCancel, true),
			reason: bkv1.ReasonCanceled, exitStatus: -1, signal: "SIGTERM", signalReason: agentapi.SignalReasonCancel,
			explanation: []string{"already ended"},
		},
		{
			name: "finished by its supervisor", progress: func() jobprogress.Progress {
				p := exitedWith(0, "", "", true)
				p.Finished = true
				return p
			}(),
			reason: bkv1.ReasonExited, exitStatus: 0, noExplanation: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dd := *d
			o := disrupted(&dd, tc.progress, tc.ran)
			assert.Equal(t, tc.reason, o.reason)
			assert.Equal(t, tc.exitStatus, o.exitStatus)
			assert.Equal(t, tc.signal, o.signal)
			assert.Equal(t, tc.signalReason, o.signalReason)
			assert.Equal(t, tc.unknown, o.progressUnknown)
			if tc.noExplanation {
				assert.Empty(t, o.explanation, "a job its supervisor finished is only recorded")
			}
			for _, e := range tc.explanation {
				assert.Contains(t, o.explanation, e)
			}
		})
	}
}
