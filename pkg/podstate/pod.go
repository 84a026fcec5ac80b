// Package podstate reads a job's pod as the kubelet and the scheduler describe it, and
// says what it means in small verdicts of its own: what the pod waits for (Waiting), how
// it ended (Ended), and whether Kubernetes took it away for a reason of its own
// (Disrupted). Each verdict carries the kubelet's own reason, since when, its message, the
// container it is about and whether it can still recover; the kubelet's and the
// scheduler's words are spelled once, in reasons.go. StateChanged says whether a pod
// moved from one state these verdicts tell apart to another: the controller's watch lets
// through only those updates of a pod.
//
// Everything here is a pure function of the pod (and, for what only the kubelet's events
// say, of its events): no clock, no client, no time limits. The controller applies its
// bounds and words to the verdicts: before a bound, it shows a notice; after it, it fails
// the job.
package podstate

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// JobRunning is the job container's running state, nil unless it runs.
func JobRunning(pod *corev1.Pod) *corev1.ContainerStateRunning {
	if cs := containerStatus(pod, podcontract.JobContainer); cs != nil {
		return cs.State.Running
	}
	return nil
}

// JobEnded is the job container's terminated state, nil unless it has ended.
func JobEnded(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	if cs := containerStatus(pod, podcontract.JobContainer); cs != nil {
		return cs.State.Terminated
	}
	return nil
}

// JobRan reports whether the job container has started at all: it runs, or has ended.
func JobRan(pod *corev1.Pod) bool {
	return JobRunning(pod) != nil || JobEnded(pod) != nil
}

// Scheduled reports whether the pod has a node.
func Scheduled(pod *corev1.Pod) bool {
	return pod.Spec.NodeName != "" || conditionTrue(pod, corev1.PodScheduled)
}

// ScheduledSince is when the pod got its node, by its PodScheduled condition, or its
// creation when the condition does not say.
func ScheduledSince(pod *corev1.Pod) time.Time {
	since := pod.CreationTimestamp.Time
	if c := condition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionTrue && c.LastTransitionTime.After(since) {
		since = c.LastTransitionTime.Time
	}
	return since
}

// Stopped reports whether nothing in the pod runs, or ever will. A pod on no node, or
// with an image that can never be had, never starts its job container; a pod is done
// once its job container or the pod itself has ended. A deleted pod whose job container
// never started is also done once its deletion has no grace left (the kubelet's final
// deletion, or a forced one): the kubelet starts no container in it then.
func Stopped(pod *corev1.Pod) bool {
	if JobEnded(pod) != nil || podEnded(pod) || pod.Spec.NodeName == "" {
		return true
	}
	if JobRan(pod) {
		return false
	}
	if neverStarts(pod) {
		return true
	}
	g := pod.DeletionGracePeriodSeconds
	return !pod.DeletionTimestamp.IsZero() && g != nil && *g == 0
}

// WarmOver reports whether a warm pod, which waits on its node for a job that is not
// its own yet, can take none any more: it ended, its job container (the supervisor
// waiting) ended, or it waits for an image it can never have. Unlike Stopped, a warm pod
// not yet on a node is not over: it is being scheduled.
func WarmOver(pod *corev1.Pod) bool {
	return JobEnded(pod) != nil || podEnded(pod) || neverStarts(pod)
}

// neverStarts: a container of the pod waits for an image it can never have, so the job
// container never starts (an init container's blocks it too).
func neverStarts(pod *corev1.Pod) bool {
	for _, cs := range statuses(pod) {
		if w := cs.State.Waiting; w != nil && (w.Reason == ReasonInvalidImageName || w.Reason == ReasonErrImageNeverPull) {
			return true
		}
	}
	return false
}

func podEnded(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// signalNames are the signals a container is most often ended by.
var signalNames = map[int32]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
	9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
}

// Signal names the signal that ended a container, "" when none did as far as its state
// tells: the runtime's own report, else the shell's convention of 128 + the signal's
// number in the exit code.
func Signal(t *corev1.ContainerStateTerminated) string {
	if t.Signal != 0 {
		if n, ok := signalNames[t.Signal]; ok {
			return n
		}
		return fmt.Sprintf("signal %d", t.Signal)
	}
	if t.ExitCode > 128 && t.ExitCode < 160 {
		if n, ok := signalNames[t.ExitCode-128]; ok {
			return n
		}
	}
	return ""
}

// TerminationReason is the reason a container ended with, when it says more than that the
// container failed or completed (OOMKilled, ContainerCannotRun, StartError, ...); "" when
// it does not.
func TerminationReason(t *corev1.ContainerStateTerminated) string {
	if t.Reason == ReasonError || t.Reason == ReasonCompleted {
		return ""
	}
	return t.Reason
}

// statuses are the pod's container statuses, its init containers' (sidecars among them)
// first, in the order the kubelet lists them.
func statuses(pod *corev1.Pod) []corev1.ContainerStatus {
	return slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses)
}

// containerStatus finds a container's status among the pod's.
func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// containerSpec is the spec of the pod's container name, as containerStatus is its
// status; nil when the spec has no such container.
func containerSpec(pod *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// image is the image of the pod's container name, "" when the spec has no such container.
func image(pod *corev1.Pod, name string) string {
	if c := containerSpec(pod, name); c != nil {
		return c.Image
	}
	return ""
}

// pulledImage is the image whose pull the kubelet's message about container name is about:
// the container's own, or that of an image volume it mounts (podbuilder's image volumes of
// the operator's and the agent's images), which the kubelet pulls for the container and
// whose failure it reports as the container's, naming the image in quotes.
func pulledImage(pod *corev1.Pod, name, message string) string {
	c := containerSpec(pod, name)
	switch {
	case c == nil:
		return ""
	case strings.Contains(message, strconv.Quote(c.Image)):
		return c.Image
	}
	for _, m := range c.VolumeMounts {
		if ref := imageVolumeRef(pod, m.Name); ref != "" && strings.Contains(message, strconv.Quote(ref)) {
			return ref
		}
	}
	return c.Image
}

// imageVolumeRef is the image of pod's image volume named volume, "" for any other volume.
func imageVolumeRef(pod *corev1.Pod, volume string) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == volume && v.Image != nil {
			return v.Image.Reference
		}
	}
	return ""
}

func isInit(pod *corev1.Pod, name string) bool {
	return slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == name })
}

func condition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func conditionTrue(pod *corev1.Pod, t corev1.PodConditionType) bool {
	c := condition(pod, t)
	return c != nil && c.Status == corev1.ConditionTrue
}
