package controller

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
)

// Disruptions: Kubernetes took the job's pod away for a reason of its own, not the job's
// (an eviction, a preemption, a node that went away). An agent stopped under its job for a
// reason of its own (a host shutdown, a spot termination) finishes the job with exit
// status -1 and signal reason agent_stop; such jobs end the same way here, so that a
// single automatic retry rule for agent_stop retries every one of them, and the job's log
// ends with what happened and what to do about it.
//
// Who finishes the job: the supervisor never does once it was told to stop (SIGTERM gives
// it agent_stop, which it leaves to the controller: see supervisor.explains), and a
// supervisor killed outright records nothing more. So the controller finishes every
// disrupted job once the pod has stopped, writing the explanation after the last chunk
// the supervisor recorded, or past any log a job can have when the record may be behind
// what reached Buildkite (explain).

// retryAdvice ends the explanation of a disrupted job: what its author can do.
const retryAdvice = "The job did not fail by itself: retry it, or let Buildkite retry jobs like it by giving the step an automatic retry rule for agent_stop " +
	"(retry: {automatic: [{signal_reason: agent_stop, limit: 2}]})."

// disruption is how Kubernetes took the job's pod away.
type disruption struct {
	// reason is the Finished condition's.
	reason string
	// what says what happened, for the job's author: whole sentences.
	what string
	// signal is what most likely ended the command when the supervisor could not record
	// it: SIGTERM where Kubernetes stops the pod gracefully, SIGKILL where the node is gone.
	signal string
}

// Reasons of the DisruptionTarget pod condition that k8s.io/api has no constants for.
const (
	disruptionEvictionAPI  = "EvictionByEvictionAPI"
	disruptionTaintManager = "DeletionByTaintManager"
	disruptionPodGC        = "DeletionByPodGC"
)

// podDisruption reads how Kubernetes disrupted the pod, or nil if it did not. The
// DisruptionTarget condition is set by whoever stops a pod for a reason of its own (the
// scheduler, the Eviction API, the taint manager, pod garbage collection, the kubelet)
// before it stops it; the pod's status reason is what the kubelet and the node lifecycle
// controller leave on a pod they ended.
func podDisruption(pod *corev1.Pod) *disruption {
	node := nodeOf(pod)
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		switch c.Reason {
		case corev1.PodReasonPreemptionByScheduler:
			return &disruption{bkv1.ReasonPreempted, sentence(
				"Kubernetes preempted the job's pod: the scheduler stopped it to make room on node "+node+" for a pod of higher priority", c.Message), "SIGTERM"}
		case disruptionEvictionAPI:
			return &disruption{bkv1.ReasonEvicted, sentence(
				"Kubernetes evicted the job's pod from node "+node+" through the Eviction API, as a node drain or the cluster autoscaler does when it empties a node", c.Message), "SIGTERM"}
		case disruptionTaintManager:
			return &disruption{bkv1.ReasonNodeLost, sentence(
				"The node "+node+" running the job's pod was lost: Kubernetes deleted the pod because the node was tainted NoExecute, most often because it stopped responding", c.Message), "SIGKILL"}
		case disruptionPodGC:
			return &disruption{bkv1.ReasonNodeDeleted, sentence(
				"The node "+node+" running the job's pod was deleted from the cluster (or taken out of service), and Kubernetes removed the pod with it", c.Message), "SIGKILL"}
		case corev1.PodReasonTerminationByKubelet:
			if d := kubeletEviction(pod, c.Message); d != nil {
				return d
			}
			if pod.Status.Reason == "Evicted" {
				// Evicted over its own storage limits, should a kubelet mark those too.
				return nil
			}
			return &disruption{bkv1.ReasonNodeShutdown, sentence(
				"The kubelet stopped the job's pod because its node "+node+" was shutting down", firstOf(c.Message, pod.Status.Message)), "SIGTERM"}
		default:
			return &disruption{bkv1.ReasonDisrupted, sentence(
				fmt.Sprintf("Kubernetes stopped the job's pod on node %s (DisruptionTarget %s)", node, c.Reason), c.Message), "SIGTERM"}
		}
	}
	switch {
	case pod.Status.Reason == "Evicted":
		// Without the condition, only the message tells node pressure (a disruption) from
		// a pod over its own storage limits (the job's doing: see storageLimitOutcome).
		return kubeletEviction(pod, "")
	case pod.Status.Reason == "NodeLost" || pod.Status.Phase == corev1.PodUnknown:
		return nodeLost(pod, firstOf(pod.Status.Message, "its kubelet stopped reporting the pod's state"))
	case pod.Status.Reason == "Terminated" && strings.Contains(pod.Status.Message, "node shutdown"):
		return &disruption{bkv1.ReasonNodeShutdown, sentence(
			"The kubelet stopped the job's pod because its node "+node+" was shutting down", pod.Status.Message), "SIGTERM"}
	}
	return nil
}

// lowOnResource starts the kubelet's message for an eviction under node pressure.
const lowOnResource = "The node was low on resource: "

// kubeletEviction is the disruption of a pod the kubelet evicted because its node ran low
// on a resource, or nil. message is the DisruptionTarget condition's, when there is one.
func kubeletEviction(pod *corev1.Pod, message string) *disruption {
	msg := firstOf(pod.Status.Message, message)
	if pod.Status.Reason != "Evicted" && !strings.Contains(msg, lowOnResource) {
		return nil
	}
	_, rest, ok := strings.Cut(msg, lowOnResource)
	if !ok {
		return nil // over its own limits, not the node's
	}
	resource, _, _ := strings.Cut(rest, ".")
	resource = strings.TrimSpace(resource)
	if resource == "" {
		resource = "a resource"
	}
	return &disruption{bkv1.ReasonNodePressure, sentence(
		"The kubelet evicted the job's pod because its node "+nodeOf(pod)+" ran low on "+resource, msg), "SIGTERM"}
}

// nodeLost is the disruption of a pod whose node stopped answering for it.
func nodeLost(pod *corev1.Pod, detail string) *disruption {
	return &disruption{bkv1.ReasonNodeLost, sentence("The node "+nodeOf(pod)+" running the job's pod was lost", detail), "SIGKILL"}
}

// disrupted is the outcome of a job whose pod Kubernetes took away (d), from the
// supervisor's record (progress, zero when there is none; ran: the job container was seen
// running). A command that ended before the disruption (it exited, or Buildkite canceled
// it) keeps its own end; any other ends -1 with agent_stop, with the signal the
// supervisor recorded, or d's.
func disrupted(d *disruption, progress jobprogress.Progress, ran bool) *outcome {
	if progress.Finished {
		// The supervisor finished the job itself: the disruption came after its end.
		return exited(progress)
	}
	if progress.Exited && (progress.SignalReason == agentapi.SignalReasonCancel || (progress.SignalReason == "" && progress.Signal == "")) {
		o := exited(progress)
		after := d.what + " The job's command had already ended, so its exit status stands."
		o.explanation = joinLines(o.explanation, after)
		o.message += " " + after
		return o
	}
	msg := d.what + " " + retryAdvice
	o := killed(d.reason, msg, d.signal, progress, ran)
	o.signalReason = agentapi.SignalReasonAgentStop
	return o
}

// storageLimitOutcome is the outcome of a pod the kubelet evicted for using more local
// storage than its limits allow: not a disruption, as a retry fails the same way.
func storageLimitOutcome(pod *corev1.Pod, signal string, progress jobprogress.Progress, ran bool) *outcome {
	msg := sentence("The kubelet evicted the job's pod because it used more local storage than its limits allow", pod.Status.Message) +
		" Give the step more ephemeral-storage (its resources, or the BuildEnvironment's), or make the job write less to its container and emptyDir volumes."
	return killed(bkv1.ReasonStorageLimitExceeded, msg, signal, progress, ran)
}

// sentence is text, with ": detail" when there is a detail, ending in a full stop.
func sentence(text, detail string) string {
	if detail = strings.TrimSpace(detail); detail != "" {
		text += ": " + strings.TrimSuffix(detail, ".")
	}
	return text + "."
}

func firstOf(a, b string) string {
	if strings.TrimSpace(a) != "" {
		return a
	}
	return b
}

func nodeOf(pod *corev1.Pod) string {
	if pod.Spec.NodeName == "" {
		return "(none)"
	}
	return pod.Spec.NodeName
}
