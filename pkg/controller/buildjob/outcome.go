package buildjob

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

var progressZero jobprogress.Progress

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

// fromTerminated is the outcome of a pod whose job container has ended (end.Job).
func fromTerminated(pod *corev1.Pod, end *podstate.End) *outcome {
	t := end.Job
	progress, perr := readProgress(t)
	kinds := end.Kinds
	if progress.EndedOnBuildkite {
		// The supervisor ran nothing, so no disruption ended a command: what else the
		// pod says, or the supervisor's record.
		kinds = slices.DeleteFunc(slices.Clone(kinds), func(k podstate.EndKind) bool { return k == podstate.EndDisrupted })
	}
	var o *outcome
	switch kinds[0] {
	case podstate.EndOOMKilled:
		o = killed(bkv1.ReasonOOMKilled, oomMessage(pod), "SIGKILL", progress, false)
	case podstate.EndDisrupted:
		d := disruptionOf(end.Disruption)
		// The container's own end says which signal came, when it says.
		d.signal = signalOr(t, d.signal)
		o = disrupted(d, progress, false)
	case podstate.EndEvicted:
		o = storageLimitOutcome(pod, signalOr(t, "SIGKILL"), progress, false)
	case podstate.EndDeadlineExceeded:
		o = killed(bkv1.ReasonDeadlineExceeded, deadlineMessage(pod), signalOr(t, "SIGKILL"), progress, false)
	default:
		o = fromRecord(pod, t, progress)
	}
	if perr != nil {
		o.message += " (" + perr.Error() + ")"
	}
	o.startedAt, o.finishedAt = t.StartedAt.Time, t.FinishedAt.Time
	return o
}

// fromRecord is the outcome of a job container that ended by itself, t, from the
// supervisor's record in its termination message (progress).
func fromRecord(pod *corev1.Pod, t *corev1.ContainerStateTerminated, progress jobprogress.Progress) *outcome {
	switch {
	case progress.Exited:
		return exited(progress)
	case progress.EndedOnBuildkite:
		return endedOnBuildkite(progress)
	case progress.Error != "":
		o := neverRan(bkv1.ReasonSupervisorFailed, "The operator's supervisor could not run the job: "+progress.Error, progress)
		if progress.Started {
			o.signalReason = ""
		}
		return o
	}
	// The supervisor died without recording an exit (killed, or it crashed): the
	// container's own exit code is all there is.
	msg := fmt.Sprintf("The job's container ended with exit code %d%s before the supervisor recorded how the job ended.", t.ExitCode, describeTermination(t))
	if t.ExitCode == 137 {
		msg += sigkillHint(pod)
	}
	return killed(bkv1.ReasonPodFailed, msg, signalOr(t, "SIGKILL"), progress, false)
}

// exited is the outcome of a job whose supervisor saw the command end: its exit status,
// and whether a cancel on Buildkite ended it.
func exited(progress jobprogress.Progress) *outcome {
	o := &outcome{
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
	return o
}

// endedOnBuildkite is the outcome of a job whose supervisor found it already over on
// Buildkite and ran nothing: Buildkite takes no start, log or finish for it any more.
func endedOnBuildkite(progress jobprogress.Progress) *outcome {
	state := progress.BuildkiteState
	if state == "" {
		state = "it refused to start it"
	}
	o := neverRan(bkv1.ReasonEndedOnBuildkite, fmt.Sprintf("The job was already over on Buildkite (%s) when its pod started, so nothing ran.", state), progress)
	o.signalReason, o.buildkiteDone = agentapi.SignalReasonCancel, true
	return o
}

// fromEnd is the outcome of a pod that ended (end): its job container ended, or the pod
// failed, succeeded or was lost around it.
func fromEnd(pod *corev1.Pod, end *podstate.End) *outcome {
	switch end.Kind() {
	case podstate.EndUnknown:
		// Its node stopped reporting it: lost, unless a DisruptionTarget condition
		// says more. It may still run there, so it is deleted.
		o := disrupted(disruptionOf(end.Disruption), progressZero, podstate.JobRan(pod))
		o.deletePod = true
		return o
	case podstate.EndNoJobStatus:
		return neverRan(bkv1.ReasonPodFailed, "The job's pod ended without a status for its job container, so how the job ended is unknown.", progressZero)
	}
	if end.Job != nil {
		return fromTerminated(pod, end)
	}
	return fromFailedPod(pod, end)
}

// fromFailedPod is the outcome of a pod that ended without its job container ending: an
// init container failed, or Kubernetes stopped the pod before the command started.
func fromFailedPod(pod *corev1.Pod, end *podstate.End) *outcome {
	ran := podstate.JobRan(pod)
	switch end.Kind() {
	case podstate.EndDisrupted:
		return disrupted(disruptionOf(end.Disruption), progressZero, ran)
	case podstate.EndEvicted:
		return storageLimitOutcome(pod, "SIGKILL", progressZero, ran)
	case podstate.EndDeadlineExceeded:
		return killed(bkv1.ReasonDeadlineExceeded, deadlineMessage(pod), "SIGKILL", progressZero, ran)
	case podstate.EndInitFailed:
		f := end.FailedInit
		return neverRan(bkv1.ReasonInitContainerFailed, fmt.Sprintf(
			"Init container %q failed with exit code %d%s, so the job's command never ran.",
			f.Name, f.Terminated.ExitCode, describeTermination(f.Terminated)), jobprogress.Progress{})
	}
	msg := "The job's pod failed before the command ran"
	if end.Reason != "" || end.Message != "" {
		msg += fmt.Sprintf(": %s %s", end.Reason, end.Message)
	}
	return neverRan(bkv1.ReasonPodFailed, strings.TrimSpace(msg)+".", jobprogress.Progress{})
}

// fromDeletedPod is the outcome of a pod deleted by someone other than the operator, once
// it has ended (or its node is gone and it never will).
func fromDeletedPod(pod *corev1.Pod, stuck bool) *outcome {
	var progress jobprogress.Progress
	t := podstate.JobEnded(pod)
	if t != nil {
		progress, _ = readProgress(t)
	}
	// With a termination message, the supervisor says whether the job started; without
	// one, a job container seen running is all there is.
	ran := t == nil && podstate.JobRan(pod)
	d := podDisruption(pod)
	if d == nil && stuck {
		d = nodeLost(pod.Spec.NodeName, "the pod was deleted but never stopped")
	}
	if d == nil {
		// Deleted by a person or a tool without saying why: the pod was taken away under
		// the job all the same, and its supervisor, told to stop, says agent_stop too.
		when := "while the job was running"
		if !podstate.JobRan(pod) {
			when = "before the job's command started"
		}
		d = &disruption{bkv1.ReasonPodDeleted, fmt.Sprintf("The job's pod %s was deleted %s, by something other than the operator.", pod.Name, when), "SIGTERM"}
	}
	if t != nil {
		d.signal = signalOr(t, d.signal)
	}
	o := disrupted(d, progress, ran)
	if t != nil {
		o.startedAt, o.finishedAt = t.StartedAt.Time, t.FinishedAt.Time
	}
	return o
}

// phaseOf is the terminal phase of a reported job.
func phaseOf(o *outcome) bkv1.BuildJobPhase {
	switch {
	case o.signalReason == agentapi.SignalReasonCancel || o.reason == bkv1.ReasonCanceled || o.reason == bkv1.ReasonBuildJobDeleted:
		return bkv1.PhaseCanceled
	case o.succeeded():
		return bkv1.PhaseSucceeded
	default:
		return bkv1.PhaseFailed
	}
}

// outcomeFromStatus rebuilds the outcome a reconcile recorded, for the one that reports it.
func outcomeFromStatus(job *bkv1.BuildJob) *outcome {
	o := &outcome{
		signal:       job.Status.Signal,
		signalReason: job.Status.SignalReason,
		message:      job.Status.Message,
	}
	if job.Status.ExitStatus != nil {
		o.exitStatus = int(*job.Status.ExitStatus)
	}
	if c := condition(job, bkv1.ConditionFinished); c != nil {
		o.reason = c.Reason
	}
	o.progress.FailedChunks = int(job.Status.Log.FailedChunks)
	if t := job.Status.Times.FinishedAt; t != nil {
		o.finishedAt = t.Time
	}
	return o
}
