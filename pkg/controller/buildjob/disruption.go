package buildjob

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
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

// podDisruption says how Kubernetes disrupted the pod (podstate.Disrupted), in the words
// of the job's author, or nil if it did not.
func podDisruption(pod *corev1.Pod) *disruption {
	return disruptionOf(podstate.Disrupted(pod))
}

// disruptionOf says d in the words of the job's author: what happened and, where
// Kubernetes said more, its words. nil for nil.
func disruptionOf(d *podstate.Disruption) *disruption {
	if d == nil {
		return nil
	}
	node := nodeOf(d.Node)
	signal := "SIGKILL" // the node is gone, and what ran there with it
	if d.Graceful {
		signal = "SIGTERM"
	}
	var reason, what string
	switch d.Kind {
	case podstate.Preempted:
		reason, what = bkv1.ReasonPreempted, "Kubernetes preempted the job's pod: the scheduler stopped it to make room on node "+node+" for a pod of higher priority"
	case podstate.EvictedByAPI:
		reason, what = bkv1.ReasonEvicted, "Kubernetes evicted the job's pod from node "+node+" through the Eviction API, as a node drain or the cluster autoscaler does when it empties a node"
	case podstate.NodeTainted:
		reason, what = bkv1.ReasonNodeLost, "The node "+node+" running the job's pod was lost: Kubernetes deleted the pod because the node was tainted NoExecute, most often because it stopped responding"
	case podstate.NodeDeleted:
		reason, what = bkv1.ReasonNodeDeleted, "The node "+node+" running the job's pod was deleted from the cluster (or taken out of service), and Kubernetes removed the pod with it"
	case podstate.NodePressure:
		reason, what = bkv1.ReasonNodePressure, "The kubelet evicted the job's pod because its node "+node+" ran low on "+firstOf(d.Resource, "a resource")
	case podstate.NodeShutdown:
		reason, what = bkv1.ReasonNodeShutdown, "The kubelet stopped the job's pod because its node "+node+" was shutting down"
	case podstate.NodeLost:
		return nodeLost(d.Node, firstOf(d.Message, "its kubelet stopped reporting the pod's state"))
	default:
		reason, what = bkv1.ReasonDisrupted, fmt.Sprintf("Kubernetes stopped the job's pod on node %s (DisruptionTarget %s)", node, d.Reason)
	}
	return &disruption{reason, sentence(what, d.Message), signal}
}

// nodeLost is the disruption of a pod whose node (node, "" for none) stopped answering
// for it.
func nodeLost(node, detail string) *disruption {
	return &disruption{bkv1.ReasonNodeLost, sentence("The node "+nodeOf(node)+" running the job's pod was lost", detail), "SIGKILL"}
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

// nodeOf names a pod's node, node ("" for none).
func nodeOf(node string) string {
	if node == "" {
		return "(none)"
	}
	return node
}
