package podstate

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// DisruptionKind is how Kubernetes took a pod away for a reason of its own, not the
// job's.
type DisruptionKind string

const (
	// Preempted: the scheduler stopped the pod to make room for one of higher priority.
	Preempted DisruptionKind = "Preempted"
	// EvictedByAPI: the Eviction API evicted it, as a node drain or the cluster
	// autoscaler does.
	EvictedByAPI DisruptionKind = "EvictedByAPI"
	// NodeTainted: the taint manager deleted it from a node tainted NoExecute, most often
	// one that stopped responding.
	NodeTainted DisruptionKind = "NodeTainted"
	// NodeDeleted: pod garbage collection removed it with its node, which was deleted or
	// taken out of service.
	NodeDeleted DisruptionKind = "NodeDeleted"
	// NodePressure: the kubelet evicted it because its node ran low on a resource.
	NodePressure DisruptionKind = "NodePressure"
	// NodeShutdown: the kubelet stopped it because its node was shutting down.
	NodeShutdown DisruptionKind = "NodeShutdown"
	// NodeLost: its node stopped reporting it.
	NodeLost DisruptionKind = "NodeLost"
	// OtherDisruption: a DisruptionTarget reason this package does not know.
	OtherDisruption DisruptionKind = "Other"
)

// Disruption is how Kubernetes took a pod away.
type Disruption struct {
	Kind DisruptionKind
	// Reason is Kubernetes' own: the DisruptionTarget condition's, or the pod's status
	// reason where no condition says.
	Reason string
	// Message is what Kubernetes said of it, "" when it said nothing.
	Message string
	// Node is the pod's node, "" when it had none.
	Node string
	// Resource is, for NodePressure, what the node ran low on ("memory", "pids", ...); ""
	// when the kubelet did not say.
	Resource string
	// Since is when the DisruptionTarget condition was set; zero without one.
	Since time.Time
	// Graceful: the pod's containers were stopped gracefully (SIGTERM, then their grace
	// period); false when its node was gone, and whatever ran there was killed with it.
	Graceful bool
}

// Disrupted reads how Kubernetes took pod away, or nil if it did not. Whoever stops a pod
// for a reason of its own (the scheduler, the Eviction API, the taint manager, pod
// garbage collection, the kubelet) sets the DisruptionTarget condition before it stops
// it; the pod's status reason is what the kubelet and the node lifecycle controller leave
// on a pod they ended. A pod the kubelet evicted for going over its own local-storage
// limits is not disrupted: that is the job's doing, and a retry fails the same way.
func Disrupted(pod *corev1.Pod) *Disruption {
	if c := condition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		return disruptionTarget(pod, c)
	}
	st := pod.Status
	switch {
	case st.Reason == ReasonEvicted:
		// Without the condition, only the message tells node pressure from a pod over
		// its own storage limits.
		return kubeletEviction(pod, st.Reason, "")
	case st.Reason == ReasonNodeLost || st.Phase == corev1.PodUnknown:
		return disruption(pod, NodeLost, st.Reason, st.Message, false)
	case st.Reason == ReasonTerminated && strings.Contains(st.Message, nodeShutdown):
		return disruption(pod, NodeShutdown, st.Reason, st.Message, true)
	}
	return nil
}

// disruptionTarget reads the DisruptionTarget condition c of pod.
func disruptionTarget(pod *corev1.Pod, c *corev1.PodCondition) *Disruption {
	var d *Disruption
	switch c.Reason {
	case DisruptionPreemptionByScheduler:
		d = disruption(pod, Preempted, c.Reason, c.Message, true)
	case DisruptionEvictionByEvictionAPI:
		d = disruption(pod, EvictedByAPI, c.Reason, c.Message, true)
	case DisruptionDeletionByTaintManager:
		d = disruption(pod, NodeTainted, c.Reason, c.Message, false)
	case DisruptionDeletionByPodGC:
		d = disruption(pod, NodeDeleted, c.Reason, c.Message, false)
	case DisruptionTerminationByKubelet:
		if d = kubeletEviction(pod, c.Reason, c.Message); d == nil {
			if pod.Status.Reason == ReasonEvicted {
				return nil // evicted over its own storage limits, marked all the same
			}
			d = disruption(pod, NodeShutdown, c.Reason, firstOf(c.Message, pod.Status.Message), true)
		}
	default:
		d = disruption(pod, OtherDisruption, c.Reason, c.Message, true)
	}
	d.Since = c.LastTransitionTime.Time
	return d
}

// kubeletEviction is the disruption of a pod the kubelet evicted because its node ran
// low on a resource, or nil. reason and message are the DisruptionTarget condition's, or
// the pod's status reason and no message.
func kubeletEviction(pod *corev1.Pod, reason, message string) *Disruption {
	msg := firstOf(pod.Status.Message, message)
	_, rest, ok := strings.Cut(msg, lowOnResource)
	if !ok {
		return nil // over its own limits, not the node's
	}
	resource, _, _ := strings.Cut(rest, ".")
	d := disruption(pod, NodePressure, reason, msg, true)
	d.Resource = strings.TrimSpace(resource)
	return d
}

func disruption(pod *corev1.Pod, kind DisruptionKind, reason, message string, graceful bool) *Disruption {
	return &Disruption{Kind: kind, Reason: reason, Message: message, Node: pod.Spec.NodeName, Graceful: graceful}
}

// firstOf is a, unless it is blank, then b.
func firstOf(a, b string) string {
	if strings.TrimSpace(a) != "" {
		return a
	}
	return b
}
