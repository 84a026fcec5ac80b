package podstate

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// WaitKind is what a pod waits for before its job container starts.
type WaitKind string

const (
	// WaitNode: the scheduler finds no node for the pod.
	WaitNode WaitKind = "Node"
	// WaitImagePull: a container's image cannot be pulled, and the kubelet keeps trying.
	WaitImagePull WaitKind = "ImagePull"
	// WaitImageInvalid: a container's image is not a valid reference; nothing recovers it.
	WaitImageInvalid WaitKind = "ImageInvalid"
	// WaitImageNeverPull: a container's image is not on the node and its pull policy is
	// Never; nothing recovers it.
	WaitImageNeverPull WaitKind = "ImageNeverPull"
	// WaitCreateContainer: a container cannot be created (a Secret or ConfigMap it refers
	// to is missing, or the runtime refuses it).
	WaitCreateContainer WaitKind = "CreateContainer"
	// WaitCrashLoop: a container keeps failing, and the kubelet waits before its next try.
	WaitCrashLoop WaitKind = "CrashLoop"
	// WaitPodSetup: the pod, on its node, cannot get ready to start its containers: a
	// volume does not mount or attach, or its sandbox cannot be made.
	WaitPodSetup WaitKind = "PodSetup"
	// WaitPulling: the kubelet is pulling a container's image, as it should.
	WaitPulling WaitKind = "Pulling"
)

// Wait is one thing the pod waits for.
type Wait struct {
	Kind WaitKind
	// Reason is Kubernetes' own word for it: the scheduler's (Unschedulable), the
	// container's waiting reason (ErrImagePull, ImagePullBackOff, ...), or the reason of
	// the kubelet's event that says so (FailedMount, Failed, Pulling, ...). For
	// WaitPodSetup, the first failure's, which stays first as the kubelet repeats it; ""
	// when only the pod's PodReadyToStartContainers condition says so.
	Reason string
	// Message is what Kubernetes said with Reason, as it wrote it.
	Message string
	// Container is the container the wait is about, "" for the whole pod; Init says it is
	// an init container (a sidecar is one too), and Image is its image.
	Container string
	Init      bool
	Image     string
	// Since is when the wait began, by the pod's own record: its creation for a node, the
	// time it got a node for its containers, the condition's or the first event's time for
	// its setup, the event's time for what only an event says.
	Since time.Time
	// Recoverable: the wait may still end by itself; false when no retry can end it.
	Recoverable bool
	// FromEvents: only the kubelet's events say so; the pod's status does not (yet).
	FromEvents bool
	// PullError is, for WaitImagePull, the error of the last pull without the kubelet's
	// framing; "" when it gave none.
	PullError string
	// LatestReason and LatestMessage are, for WaitPodSetup, the latest failure's.
	LatestReason, LatestMessage string
	// LastExit is, for WaitCrashLoop, how the container's last run ended.
	LastExit *corev1.ContainerStateTerminated
}

// Waits are what a pod waits for, in the order Waiting finds them.
type Waits []Wait

// First is the first wait of kind, or nil.
func (ws Waits) First(kind WaitKind) *Wait {
	if i := slices.IndexFunc(ws, func(w Wait) bool { return w.Kind == kind }); i >= 0 {
		return &ws[i]
	}
	return nil
}

// Input is what the checks read, gathered once for all of them.
type Input struct {
	Pod *corev1.Pod
	// Events are the pod's events, oldest first; nil when they were not read (the kubelet
	// writes events only for a pod on its node).
	Events []corev1.Event
}

// Gather makes the checks' input from pod and its events, in any order.
func Gather(pod *corev1.Pod, events []corev1.Event) Input {
	return Input{Pod: pod, Events: oldestFirst(events)}
}

// A Check reads one kind of wait from the input: what it finds, in the order the pod
// shows it, or nothing.
type Check func(Input) Waits

// Chain runs checks in turn; unlike a chain that stops at the first verdict, it gathers
// every one, as a caller may fail a job on one wait and show another.
type Chain []Check

// Evaluate runs the chain's checks on in.
func (c Chain) Evaluate(in Input) Waits {
	var out Waits
	for _, check := range c {
		out = append(out, check(in)...)
	}
	return out
}

// waitChecks are Waiting's checks, in the order of what matters most to the job's
// author: no node, a container's own state, a failed pull the events tell first, the
// pod's setup, and last an image being pulled.
var waitChecks = Chain{NoNode, ContainersWaiting, PullFailedInEvents, SetupFailing, PullingImages}

// Waiting is what pod, which has not started its job container, waits for; events are
// its events (nil when not read). Nothing when it waits for nothing unusual.
func Waiting(pod *corev1.Pod, events []corev1.Event) Waits {
	return waitChecks.Evaluate(Gather(pod, events))
}

// NoNode finds a pod the scheduler cannot place.
func NoNode(in Input) Waits {
	c := condition(in.Pod, corev1.PodScheduled)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != ReasonUnschedulable {
		return nil
	}
	return Waits{{
		Kind: WaitNode, Reason: c.Reason, Message: c.Message,
		Since: in.Pod.CreationTimestamp.Time, Recoverable: true,
	}}
}

// containerWaits are the container waiting reasons a check reads, and what they mean.
var containerWaits = map[string]struct {
	kind        WaitKind
	recoverable bool
}{
	ReasonErrImagePull:               {WaitImagePull, true},
	ReasonImagePullBackOff:           {WaitImagePull, true},
	ReasonInvalidImageName:           {WaitImageInvalid, false},
	ReasonErrImageNeverPull:          {WaitImageNeverPull, false},
	ReasonCreateContainerConfigError: {WaitCreateContainer, true},
	ReasonCreateContainerError:       {WaitCreateContainer, true},
	ReasonCrashLoopBackOff:           {WaitCrashLoop, true},
}

// ContainersWaiting finds the containers whose status says they cannot start: an image,
// a create that fails, or a container that keeps failing. A container being created
// (ContainerCreating, PodInitializing) waits for nothing unusual.
func ContainersWaiting(in Input) Waits {
	var out Waits
	for _, cs := range statuses(in.Pod) {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		what, ok := containerWaits[w.Reason]
		if !ok {
			continue
		}
		wait := Wait{
			Kind: what.kind, Reason: w.Reason, Message: w.Message,
			Container: cs.Name, Init: isInit(in.Pod, cs.Name), Image: pulledImage(in.Pod, cs.Name, w.Message),
			Since: ScheduledSince(in.Pod), Recoverable: what.recoverable,
		}
		switch what.kind {
		case WaitImagePull:
			wait.PullError = pullError(w.Message)
		case WaitCrashLoop:
			wait.LastExit = cs.LastTerminationState.Terminated
		}
		out = append(out, wait)
	}
	return out
}

// PullFailedInEvents finds, from the kubelet's events, the containers whose image's last
// pull failed, unless a pull worked since or the container is no longer waiting: the
// kubelet records the failure before it writes the container's ErrImagePull status.
func PullFailedInEvents(in Input) Waits {
	order, failed := lastPullEvents(in.Events, isFailedPull)
	_, pulled := lastPullEvents(in.Events, isPulled)
	var out Waits
	for _, name := range order {
		e := failed[name]
		if p := pulled[name]; p != nil && !eventLastTime(p).Before(eventLastTime(e)) {
			continue // a later pull worked
		}
		if !stillWaiting(in.Pod, name) {
			continue
		}
		out = append(out, Wait{
			Kind: WaitImagePull, Reason: e.Reason, Message: e.Message,
			Container: name, Init: isInit(in.Pod, name), Image: pulledImage(in.Pod, name, e.Message),
			Since: eventLastTime(e), Recoverable: true, FromEvents: true, PullError: eventPullError(e.Message),
		})
	}
	return out
}

// SetupFailing finds a pod on a node that cannot get ready to start its containers. The
// kubelet says so in the PodReadyToStartContainers condition (False until the volumes
// and the sandbox are ready) and in its events; a kubelet without the condition leaves
// the events alone. The wait is since the condition changed, or the first failure.
func SetupFailing(in Input) Waits {
	pod := in.Pod
	if pod.Spec.NodeName == "" {
		return nil
	}
	c := condition(pod, corev1.PodReadyToStartContainers)
	if c != nil && c.Status == corev1.ConditionTrue {
		return nil
	}
	failures := setupFailures(in.Events)
	w := Wait{Kind: WaitPodSetup, Recoverable: true}
	switch {
	case c != nil:
		w.Since = c.LastTransitionTime.Time
	case len(failures) == 0:
		return nil
	default:
		w.Since = eventTime(&failures[0])
	}
	if w.Since.IsZero() {
		w.Since = pod.CreationTimestamp.Time
	}
	if n := len(failures); n > 0 {
		w.Reason, w.Message = failures[0].Reason, failures[0].Message
		w.LatestReason, w.LatestMessage = failures[n-1].Reason, failures[n-1].Message
	}
	return Waits{w}
}

// PullingImages finds the containers whose image the kubelet is pulling: for each, the
// last event about its image says the pull started.
func PullingImages(in Input) Waits {
	order, last := lastPullEvents(in.Events, isPullEvent)
	var out Waits
	for _, name := range order {
		e := last[name]
		if e.Reason != eventPulling || !stillWaiting(in.Pod, name) {
			continue
		}
		img := image(in.Pod, name)
		if img == "" {
			continue // not a container of this pod's spec
		}
		out = append(out, Wait{
			Kind: WaitPulling, Reason: e.Reason, Message: e.Message,
			Container: name, Init: isInit(in.Pod, name), Image: img,
			Since: eventLastTime(e), Recoverable: true, FromEvents: true,
		})
	}
	return out
}

// stillWaiting: the container has not run yet, as far as its status says (a container
// without a status has not).
func stillWaiting(pod *corev1.Pod, name string) bool {
	cs := containerStatus(pod, name)
	return cs == nil || cs.State.Waiting != nil
}
