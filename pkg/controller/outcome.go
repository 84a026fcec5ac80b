package controller

import (
	"fmt"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// outcome is how a job ended: what Buildkite is told, and what the log and the BuildJob say.
// It is computed from the pod alone (the operator's finalizer keeps the pod until it is
// recorded), so a reconcile that repeats it after a restart gets the same outcome and
// uploads the same explanation at the same offset.
type outcome struct {
	reason       string
	exitStatus   int
	signal       string
	signalReason string
	// message says what happened, for the BuildJob status and events.
	message string
	// explanation, when set, is appended to the Buildkite log after the supervisor's output.
	explanation string
	progress    jobprogress.Progress
	startedAt   time.Time
	finishedAt  time.Time
	// deletePod is set when the pod is still running something that must stop.
	deletePod bool
	// buildkiteDone: Buildkite has already ended the job (canceled before it started), so
	// it takes no start, log or finish.
	buildkiteDone bool
	// commandRan: the job container was seen running, though its progress is unknown; the
	// supervisor started the job, so it is not started again.
	commandRan bool
	// progressUnknown: the supervisor's record was lost with its pod, so where its output
	// ends is unknown.
	progressUnknown bool
}

func (o *outcome) succeeded() bool {
	return o.exitStatus == 0 && o.signal == "" && o.signalReason == ""
}

// neverRan is the outcome of a job whose command never ran: -1 and stack_error, as the
// agent reports a job it could not run.
func neverRan(reason, message string, progress jobprogress.Progress) *outcome {
	return &outcome{
		reason:       reason,
		exitStatus:   -1,
		signalReason: agentapi.SignalReasonStackError,
		message:      message,
		explanation:  message,
		progress:     progress,
	}
}

// killed is the outcome of a job whose command ran (ran: the job container was seen
// running) and was stopped from outside: -1 and the signal, unless the supervisor saw the
// command end first.
func killed(reason, message, signal string, progress jobprogress.Progress, ran bool) *outcome {
	if !progress.Started && !ran {
		return neverRan(reason, message, progress)
	}
	o := &outcome{reason: reason, exitStatus: -1, signal: signal, message: message, explanation: message, progress: progress,
		commandRan: ran, progressUnknown: !progress.Started && ran}
	if progress.Exited {
		o.exitStatus, o.signal, o.signalReason = progress.ExitStatus, progress.Signal, progress.SignalReason
	}
	if !progress.Flushed {
		o.explanation += "\nSome of the job's output may be missing above: its container ended before all of it was sent."
	}
	return o
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

// jobTerminated is the job container's terminated state, if it has ended.
func jobTerminated(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	cs := containerStatus(pod, podcontract.JobContainer)
	if cs == nil {
		return nil
	}
	if cs.State.Terminated != nil {
		return cs.State.Terminated
	}
	return nil
}

// jobRunning is the job container's running state, if it is running.
func jobRunning(pod *corev1.Pod) *corev1.ContainerStateRunning {
	cs := containerStatus(pod, podcontract.JobContainer)
	if cs == nil {
		return nil
	}
	return cs.State.Running
}

// jobEverRan reports whether the job container has started at all.
func jobEverRan(pod *corev1.Pod) bool {
	return jobRunning(pod) != nil || jobTerminated(pod) != nil
}

// readProgress reads the supervisor's record from the job container's termination message.
// A message that is not a record (an empty one, or a container that never wrote one) is a
// job that never started, as far as the supervisor could tell.
func readProgress(t *corev1.ContainerStateTerminated) (jobprogress.Progress, error) {
	if t == nil {
		return jobprogress.Progress{}, nil
	}
	return jobprogress.Decode(strings.TrimSpace(t.Message))
}

// fromTerminated is the outcome of a pod whose job container has ended.
func fromTerminated(pod *corev1.Pod, t *corev1.ContainerStateTerminated) *outcome {
	progress, perr := readProgress(t)
	var o *outcome
	switch {
	case t.Reason == "OOMKilled":
		o = killed(bkv1.ReasonOOMKilled, oomMessage(pod), "SIGKILL", progress, false)
	case pod.Status.Reason == "Evicted":
		o = killed(bkv1.ReasonEvicted, evictedMessage(pod), signalOr(t, "SIGKILL"), progress, false)
	case pod.Status.Reason == "DeadlineExceeded":
		o = killed(bkv1.ReasonDeadlineExceeded, deadlineMessage(pod), signalOr(t, "SIGKILL"), progress, false)
	case progress.Exited:
		o = &outcome{
			reason:       bkv1.ReasonExited,
			exitStatus:   progress.ExitStatus,
			signal:       progress.Signal,
			signalReason: progress.SignalReason,
			progress:     progress,
			message:      exitMessage(progress.ExitStatus, progress.Signal),
		}
		if progress.SignalReason == agentapi.SignalReasonCancel {
			o.reason = bkv1.ReasonCanceled
			o.message = "The job was canceled on Buildkite; " + o.message
		}
		if !progress.Flushed {
			o.explanation = "Some of the job's output may be missing above: the supervisor ended before all of it was sent."
		}
	case progress.Error != "":
		o = neverRan(bkv1.ReasonSupervisorFailed, "The operator's supervisor could not run the job: "+progress.Error, progress)
		if progress.Started {
			o.signalReason = ""
		}
	default:
		// The supervisor died without recording an exit (killed, or it crashed): the
		// container's own exit code is all there is.
		signal := signalOf(t)
		msg := fmt.Sprintf("The job's container ended with exit code %d%s before the supervisor recorded how the job ended.", t.ExitCode, describeTermination(t))
		if t.ExitCode == 137 {
			msg += sigkillHint(pod)
		}
		if signal == "" {
			signal = "SIGKILL"
		}
		o = killed(bkv1.ReasonPodFailed, msg, signal, progress, false)
	}
	if perr != nil {
		o.message += " (" + perr.Error() + ")"
	}
	o.startedAt, o.finishedAt = t.StartedAt.Time, t.FinishedAt.Time
	return o
}

// fromFailedPod is the outcome of a pod that ended without its job container ending: an
// init container failed, or Kubernetes stopped the pod before the command started.
func fromFailedPod(pod *corev1.Pod) *outcome {
	ran := jobEverRan(pod)
	switch pod.Status.Reason {
	case "Evicted":
		return killed(bkv1.ReasonEvicted, evictedMessage(pod), "SIGKILL", jobprogress.Progress{}, ran)
	case "DeadlineExceeded":
		return killed(bkv1.ReasonDeadlineExceeded, deadlineMessage(pod), "SIGKILL", jobprogress.Progress{}, ran)
	case "NodeLost":
		return killed(bkv1.ReasonNodeLost, nodeLostMessage(pod, pod.Status.Message), "SIGKILL", jobprogress.Progress{}, ran)
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return neverRan(bkv1.ReasonInitContainerFailed, fmt.Sprintf(
				"Init container %q failed with exit code %d%s, so the job's command never ran.",
				cs.Name, t.ExitCode, describeTermination(t)), jobprogress.Progress{})
		}
	}
	msg := "The job's pod failed before the command ran"
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		msg += fmt.Sprintf(": %s %s", pod.Status.Reason, pod.Status.Message)
	}
	return neverRan(bkv1.ReasonPodFailed, strings.TrimSpace(msg)+".", jobprogress.Progress{})
}

// waitingFailure looks for a container that cannot start: an image that cannot be pulled
// or is invalid, or a container that cannot be created. It returns the outcome when the
// failure is final (at once for an invalid image, after grace for the others) and
// otherwise how long until it would be.
func waitingFailure(pod *corev1.Pod, grace time.Duration, now time.Time) (*outcome, time.Duration) {
	since := pod.CreationTimestamp.Time
	if c := podCondition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionTrue && c.LastTransitionTime.After(since) {
		since = c.LastTransitionTime.Time
	}
	left := since.Add(grace).Sub(now)
	var wait time.Duration
	all := append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	for _, cs := range all {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		image := containerImage(pod, cs.Name)
		detail := ""
		if w.Message != "" {
			detail = ": " + w.Message
		}
		switch w.Reason {
		case "InvalidImageName":
			return neverRan(bkv1.ReasonInvalidImage, fmt.Sprintf(
				"The image %q of container %q is not a valid image reference%s. Fix the image in the BuildEnvironment, for example golang:1.26 or registry.example.com/ci/go@sha256:....",
				image, cs.Name, detail), jobprogress.Progress{}), 0
		case "ErrImageNeverPull":
			return neverRan(bkv1.ReasonImagePullFailed, fmt.Sprintf(
				"The image %q of container %q is not on the node, and its pull policy is Never%s. Load the image onto the nodes, or set imagePullPolicy to IfNotPresent.",
				image, cs.Name, detail), jobprogress.Progress{}), 0
		case "ErrImagePull", "ImagePullBackOff":
			if left <= 0 {
				return neverRan(bkv1.ReasonImagePullFailed, fmt.Sprintf(
					"The image %q of container %q could not be pulled (%s%s). Check the image's name and tag, and that the cluster can reach its registry (a private registry needs imagePullSecrets in the BuildEnvironment).",
					image, cs.Name, w.Reason, detail), jobprogress.Progress{}), 0
			}
			wait = left
		case "CreateContainerConfigError", "CreateContainerError":
			if left <= 0 {
				return neverRan(bkv1.ReasonCreateContainerError, fmt.Sprintf(
					"Container %q could not be created (%s%s). Check the Secrets, ConfigMaps and volumes the BuildEnvironment refers to.",
					cs.Name, w.Reason, detail), jobprogress.Progress{}), 0
			}
			wait = left
		}
	}
	return nil, wait
}

// unschedulable returns the outcome of a pod that has been unschedulable for longer than
// timeout, and otherwise how long until it would be (0 when it is not unschedulable).
func unschedulable(pod *corev1.Pod, timeout time.Duration, now time.Time) (*outcome, time.Duration) {
	c := podCondition(pod, corev1.PodScheduled)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
		return nil, 0
	}
	since := pod.CreationTimestamp.Time
	left := since.Add(timeout).Sub(now)
	if left > 0 {
		return nil, left
	}
	msg := fmt.Sprintf("The job's pod could not be scheduled for %s", timeout)
	if c.Message != "" {
		msg += ": " + c.Message
	}
	msg += ". Ask for fewer resources, or check the BuildEnvironment's nodeSelector, tolerations and affinity against the cluster's nodes."
	return neverRan(bkv1.ReasonUnschedulable, msg, jobprogress.Progress{}), 0
}

// fromDeletedPod is the outcome of a pod deleted by someone other than the operator, once
// it has ended (or its node is gone and it never will).
func fromDeletedPod(pod *corev1.Pod, stuck bool) *outcome {
	var progress jobprogress.Progress
	t := jobTerminated(pod)
	if t != nil {
		progress, _ = readProgress(t)
	}
	// With a termination message, the supervisor says whether the job started; without
	// one, a job container seen running is all there is.
	ran := t == nil && jobEverRan(pod)
	var o *outcome
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		switch c.Reason {
		case "DeletionByTaintManager", "DeletionByPodGC":
			o = killed(bkv1.ReasonNodeLost, nodeLostMessage(pod, c.Message), "SIGKILL", progress, ran)
		case "EvictionByEvictionAPI", "TerminationByKubelet":
			o = killed(bkv1.ReasonEvicted, "Kubernetes evicted the job's pod: "+strings.TrimSuffix(c.Message, ".")+".", "SIGTERM", progress, ran)
		case "PreemptionByScheduler":
			o = killed(bkv1.ReasonPreempted, "The scheduler preempted the job's pod to make room for a pod of higher priority: "+strings.TrimSuffix(c.Message, ".")+".", "SIGTERM", progress, ran)
		}
	}
	if o == nil && stuck {
		o = killed(bkv1.ReasonNodeLost, nodeLostMessage(pod, "the pod was deleted but never stopped"), "SIGKILL", progress, ran)
	}
	if o == nil {
		when := "while the job was running"
		if !jobEverRan(pod) {
			when = "before the job's command started"
		}
		o = killed(bkv1.ReasonPodDeleted, fmt.Sprintf("The job's pod %s was deleted %s, by something other than the operator.", pod.Name, when), "SIGTERM", progress, ran)
	}
	if t != nil {
		o.startedAt, o.finishedAt = t.StartedAt.Time, t.FinishedAt.Time
	}
	return o
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func containerImage(pod *corev1.Pod, name string) string {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for _, c := range list {
			if c.Name == name {
				return c.Image
			}
		}
	}
	return ""
}

func oomMessage(pod *corev1.Pod) string {
	limit := "no memory limit, so the node itself ran out of memory"
	if q, ok := jobMemoryLimit(pod); ok {
		limit = "a memory limit of " + q
	}
	return fmt.Sprintf("The job's container ran out of memory and was killed (OOMKilled); it had %s. Give the step more memory (its resources, or the BuildEnvironment's), or make the job use less.", limit)
}

// sigkillHint explains an exit code of 137 that came without a reason. The runtime names
// an OOM kill only when it saw the kernel's OOM event, which it can miss (a container killed
// very early, or all its processes killed together), so say what most often sends SIGKILL.
func sigkillHint(pod *corev1.Pod) string {
	limit := "the node's memory"
	if q, ok := jobMemoryLimit(pod); ok {
		limit = "its memory limit of " + q
	}
	return fmt.Sprintf(" Exit code 137 is SIGKILL, most often from the kernel's OOM killer when the job uses more than %s: if the step needs more, give it more memory (its resources, or the BuildEnvironment's).", limit)
}

// jobMemoryLimit is the job container's memory limit, if it has one.
func jobMemoryLimit(pod *corev1.Pod) (string, bool) {
	for _, c := range pod.Spec.Containers {
		if c.Name == podcontract.JobContainer {
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				return q.String(), true
			}
		}
	}
	return "", false
}

func evictedMessage(pod *corev1.Pod) string {
	msg := "Kubernetes evicted the job's pod"
	if pod.Status.Message != "" {
		msg += ": " + strings.TrimSuffix(pod.Status.Message, ".")
	}
	return msg + "."
}

func deadlineMessage(pod *corev1.Pod) string {
	msg := "The job's pod ran past its deadline and Kubernetes stopped it"
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		msg += fmt.Sprintf(" (activeDeadlineSeconds %d: the job's timeout and a margin)", *d)
	}
	if pod.Status.Message != "" {
		msg += ": " + strings.TrimSuffix(pod.Status.Message, ".")
	}
	return msg + "."
}

func nodeLostMessage(pod *corev1.Pod, detail string) string {
	node := pod.Spec.NodeName
	if node == "" {
		node = "(unknown)"
	}
	msg := fmt.Sprintf("The node %s running the job's pod was lost", node)
	if detail != "" {
		msg += ": " + strings.TrimSuffix(detail, ".")
	}
	return msg + ". The job's result is unknown; retry it."
}

func exitMessage(status int, signal string) string {
	if signal != "" {
		return fmt.Sprintf("the command was killed by %s.", signal)
	}
	return fmt.Sprintf("the command exited with status %d.", status)
}

func describeTermination(t *corev1.ContainerStateTerminated) string {
	var parts []string
	if t.Reason != "" && t.Reason != "Error" && t.Reason != "Completed" {
		parts = append(parts, t.Reason)
	}
	if s := signalOf(t); s != "" {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

var signalNames = map[int32]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
	9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM",
}

func signalOr(t *corev1.ContainerStateTerminated, def string) string {
	if s := signalOf(t); s != "" {
		return s
	}
	return def
}

// signalOf names the signal that ended a container: the runtime's own report, else the
// shell convention of 128 + signal number.
func signalOf(t *corev1.ContainerStateTerminated) string {
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
