package podstate

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// StateChanged reports whether the pod moved, between old and new, from one state the
// verdicts tell apart to another: deleted or not, its phase and reason, a disruption, being
// unschedulable, and each container's state (waiting and why, running, or terminated and
// how). What only refines a state it does not count: messages, times, readiness, the node
// it was bound to, its resource version. A controller that re-reads a pending pod on its
// own poll (the bounds on a wait are timed from the pod, not from the event) needs an event
// only for these moves.
func StateChanged(old, new *corev1.Pod) bool {
	return stateKey(old) != stateKey(new)
}

// stateKey spells what StateChanged compares.
func stateKey(pod *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "deleting=%t phase=%s reason=%s", !pod.DeletionTimestamp.IsZero(), pod.Status.Phase, pod.Status.Reason)
	for _, t := range []corev1.PodConditionType{corev1.DisruptionTarget, corev1.PodScheduled} {
		if c := condition(pod, t); c != nil && (t == corev1.DisruptionTarget || c.Status == corev1.ConditionFalse) {
			fmt.Fprintf(&b, " %s=%s/%s", t, c.Status, c.Reason)
		}
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			fmt.Fprintf(&b, " %s:%d:", cs.Name, cs.RestartCount)
			switch s := cs.State; {
			case s.Terminated != nil:
				fmt.Fprintf(&b, "terminated/%d/%s/%d", s.Terminated.ExitCode, s.Terminated.Reason, s.Terminated.Signal)
			case s.Running != nil:
				b.WriteString("running")
			case s.Waiting != nil:
				b.WriteString("waiting/" + s.Waiting.Reason)
			}
		}
	}
	return b.String()
}
