package podstate

import (
	"regexp"

	corev1 "k8s.io/api/core/v1"
)

// The words the kubelet and the scheduler write into a pod's status and events, as a
// kubelet of Kubernetes 1.35 writes them. Each is spelled here and nowhere else in the
// operator: the rest of it reads verdicts (Wait, End, Disruption), not these strings.

// Why a container waits: status.containerStatuses[].state.waiting.reason.
const (
	ReasonErrImagePull               = "ErrImagePull"
	ReasonImagePullBackOff           = "ImagePullBackOff"
	ReasonInvalidImageName           = "InvalidImageName"
	ReasonErrImageNeverPull          = "ErrImageNeverPull"
	ReasonCreateContainerConfigError = "CreateContainerConfigError"
	ReasonCreateContainerError       = "CreateContainerError"
	ReasonCrashLoopBackOff           = "CrashLoopBackOff"
)

// How a container ended: state.terminated.reason. Error and Completed say only that it
// failed or did not; the runtime's other reasons say more.
const (
	ReasonOOMKilled = "OOMKilled"
	ReasonError     = "Error"
	ReasonCompleted = "Completed"
)

// Why a pod ended: status.reason, set by the kubelet or the node lifecycle controller.
const (
	ReasonEvicted          = "Evicted"
	ReasonDeadlineExceeded = "DeadlineExceeded"
	ReasonNodeLost         = "NodeLost"
	ReasonTerminated       = "Terminated"
)

// Why the scheduler cannot place a pod: the PodScheduled condition's reason.
const ReasonUnschedulable = corev1.PodReasonUnschedulable

// Who stopped a pod for a reason of its own: the DisruptionTarget condition's reason.
const (
	DisruptionPreemptionByScheduler  = corev1.PodReasonPreemptionByScheduler
	DisruptionEvictionByEvictionAPI  = "EvictionByEvictionAPI"
	DisruptionDeletionByTaintManager = "DeletionByTaintManager"
	DisruptionDeletionByPodGC        = "DeletionByPodGC"
	DisruptionTerminationByKubelet   = corev1.PodReasonTerminationByKubelet
)

// The kubelet's event reasons about a pod that cannot get ready to start its containers:
// its volumes, or its sandbox.
var setupFailureEvents = map[string]bool{
	"FailedMount": true, "FailedAttachVolume": true, "FailedMapVolume": true, "FailedCreatePodSandBox": true,
}

// The kubelet's event reasons about a container's image.
const (
	eventPulling = "Pulling"
	eventPulled  = "Pulled"
	eventFailed  = "Failed"
)

// pullEvents are the event reasons about an image being pulled, or done with.
var pullEvents = map[string]bool{
	eventPulling: true, eventPulled: true, eventFailed: true, "BackOff": true,
	ReasonErrImageNeverPull: true, "InspectFailed": true,
}

// The kubelet's messages, where a verdict reads them.
var (
	// lowOnResource starts the message of an eviction under node pressure, before the
	// resource: "The node was low on resource: memory. Threshold quantity: ...".
	lowOnResource = "The node was low on resource: "
	// nodeShutdown is in the message of a pod the kubelet ended as its node shut down
	// ("Pod was terminated in response to imminent node shutdown.").
	nodeShutdown = "node shutdown"
	// backOffPrefix starts the message of a container in ImagePullBackOff, before the
	// last pull's error: `Back-off pulling image "x": ErrImagePull: <error>`.
	backOffPrefix = regexp.MustCompile(`^Back-off pulling image "[^"]*":?\s*`)
	// errImagePullPrefix starts the last pull's error in that message.
	errImagePullPrefix = ReasonErrImagePull + ": "
	// failedPullPrefix starts the message of the event about a failed pull, before the
	// pull's error (the message of the container's ErrImagePull status).
	failedPullPrefix = regexp.MustCompile(`^Failed to pull image "[^"]*":?\s*`)
	// fieldPathContainer finds the container an event is about in its
	// involvedObject.fieldPath, such as spec.containers{job}.
	fieldPathContainer = regexp.MustCompile(`^spec\.(?:initContainers|containers)\{(.+)\}$`)
)
