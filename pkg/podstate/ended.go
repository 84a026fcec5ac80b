package podstate

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// EndKind is one thing that says how a pod, or its job container, ended.
type EndKind string

const (
	// EndOOMKilled: the job container ran out of memory and was killed.
	EndOOMKilled EndKind = "OOMKilled"
	// EndDisrupted: Kubernetes took the pod away for a reason of its own (End.Disruption).
	EndDisrupted EndKind = "Disrupted"
	// EndEvicted: the kubelet evicted the pod: under node pressure when EndDisrupted is
	// among the kinds too, over its own local-storage limits when it is not.
	EndEvicted EndKind = "Evicted"
	// EndDeadlineExceeded: the pod ran past its activeDeadlineSeconds.
	EndDeadlineExceeded EndKind = "DeadlineExceeded"
	// EndInitFailed: an init container failed (End.FailedInit), so the pod failed.
	EndInitFailed EndKind = "InitFailed"
	// EndJobEnded: the job container ended (End.Job); what it recorded says how the job
	// did.
	EndJobEnded EndKind = "JobEnded"
	// EndPodFailed: the pod failed, and says no more than its status reason and message.
	EndPodFailed EndKind = "PodFailed"
	// EndNoJobStatus: the pod succeeded without a status for its job container.
	EndNoJobStatus EndKind = "NoJobStatus"
	// EndUnknown: the pod's node stopped reporting it (phase Unknown); it may still run
	// there. End.Disruption says what else is known.
	EndUnknown EndKind = "Unknown"
)

// End is how a pod, or its job container, ended.
type End struct {
	// Kinds are the kinds that apply, the one that says most first: a job container
	// killed for memory says more than the pod's eviction around it, a disruption more
	// than the container's exit. Kinds ends in EndJobEnded, EndPodFailed, EndNoJobStatus
	// or EndUnknown.
	Kinds []EndKind
	// Reason and Message are the pod's status reason and message, as Kubernetes set them.
	Reason, Message string
	// Job is the job container's end; nil when it did not end.
	Job *corev1.ContainerStateTerminated
	// Disruption is how Kubernetes took the pod away, with EndDisrupted and EndUnknown.
	Disruption *Disruption
	// FailedInit is the first init container that failed, with EndInitFailed.
	FailedInit *FailedContainer
}

// FailedContainer is a container that ended in failure.
type FailedContainer struct {
	Name       string
	Terminated *corev1.ContainerStateTerminated
}

// Kind is the kind that says most of how the pod ended.
func (e *End) Kind() EndKind { return e.Kinds[0] }

// Has reports whether kind is among the end's kinds.
func (e *End) Has(kind EndKind) bool { return slices.Contains(e.Kinds, kind) }

// Ended says how pod ended: its job container ended, or the pod failed, succeeded or was
// lost around it. nil while the pod goes on.
func Ended(pod *corev1.Pod) *End {
	st := pod.Status
	e := &End{Reason: st.Reason, Message: st.Message, Job: JobEnded(pod), Disruption: Disrupted(pod)}
	switch {
	case e.Job != nil:
		if e.Job.Reason == ReasonOOMKilled {
			e.Kinds = []EndKind{EndOOMKilled}
		}
		e.Kinds = append(append(e.Kinds, e.statusKinds()...), EndJobEnded)
	case st.Phase == corev1.PodFailed:
		e.Kinds = e.statusKinds()
		if f := failedInit(pod); f != nil {
			e.FailedInit = f
			e.Kinds = append(e.Kinds, EndInitFailed)
		}
		e.Kinds = append(e.Kinds, EndPodFailed)
	case st.Phase == corev1.PodSucceeded:
		e.Kinds = []EndKind{EndNoJobStatus}
	case st.Phase == corev1.PodUnknown:
		if e.Disruption == nil {
			e.Disruption = disruption(pod, NodeLost, "", "", false)
		}
		e.Kinds = []EndKind{EndUnknown}
	default:
		return nil
	}
	return e
}

// statusKinds are the kinds the pod's conditions and status reason say.
func (e *End) statusKinds() []EndKind {
	var kinds []EndKind
	if e.Disruption != nil {
		kinds = append(kinds, EndDisrupted)
	}
	switch e.Reason {
	case ReasonEvicted:
		kinds = append(kinds, EndEvicted)
	case ReasonDeadlineExceeded:
		kinds = append(kinds, EndDeadlineExceeded)
	}
	return kinds
}

// failedInit is the first of pod's init containers that ended in failure, or nil.
func failedInit(pod *corev1.Pod) *FailedContainer {
	for _, cs := range pod.Status.InitContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return &FailedContainer{Name: cs.Name, Terminated: t}
		}
	}
	return nil
}
