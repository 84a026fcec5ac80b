package buildjob

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// readProgress reads the supervisor's record from the job container's termination message.
// A message that is not a record (an empty one, or a container that never wrote one) is a
// job that never started, as far as the supervisor could tell.
func readProgress(t *corev1.ContainerStateTerminated) (jobprogress.Progress, error) {
	if t == nil {
		return jobprogress.Progress{}, nil
	}
	return jobprogress.Decode(strings.TrimSpace(t.Message))
}

// observe looks at the job's pod and either returns how the job ended, or brings the
// BuildJob's status up to date and says when to look again.
func (r *Reconciler) observe(ctx context.Context, s *scope) (*outcome, error) {
	job, pod := s.job, s.pod
	if !job.DeletionTimestamp.IsZero() {
		return r.observeDeleted(ctx, s)
	}
	if pod == nil {
		if r.mayHaveHadPod(s) {
			o, create, err := r.lostPod(ctx, s)
			if err != nil || !create {
				return o, err
			}
		}
		return r.createPod(ctx, s)
	}
	o, err := r.observePod(ctx, s)
	if err != nil || o != nil {
		// The outcome's write records the pod too.
		return o, err
	}
	left, err := r.recordPod(ctx, s)
	if err != nil {
		return nil, err
	}
	s.requeueAfter(left)
	return nil, nil
}

// observePod looks at the job's pod: how the job ended, or what it waits for and when to
// look again.
func (r *Reconciler) observePod(ctx context.Context, s *scope) (*outcome, error) {
	job, pod := s.job, s.pod
	if !pod.DeletionTimestamp.IsZero() {
		// Until a deleted pod has stopped, even one that has not started its command
		// may still start it: the job is not finished before.
		stuck := s.now.After(pod.DeletionTimestamp.Add(r.opts.PodTerminationTimeout))
		if !podstate.Stopped(pod) && !stuck {
			wait := pod.DeletionTimestamp.Add(r.opts.PodTerminationTimeout).Sub(s.now)
			s.requeueAfter(max(wait, time.Second))
			return nil, nil
		}
		if o := stoppedOutcome(job, pod); o != nil {
			return o, nil
		}
		return fromDeletedPod(pod, stuck), nil
	}
	if end := podstate.Ended(pod); end != nil {
		return fromEnd(pod, end), nil
	}
	if podstate.JobRunning(pod) != nil {
		if err := r.clearWait(ctx, s, commandStarted); err != nil {
			return nil, err
		}
		return r.watchRunning(ctx, s)
	}
	return r.observePending(ctx, s)
}

// deletedOutcome is how a job ends whose BuildJob was deleted before its finish was
// reported: the operator stops it for a reason of its own, not the job's, as an agent
// that is stopped mid-job does: -1 and agent_stop (a step's automatic retry rule for
// agent_stop matches it), not cancel, which Buildkite's own cancel keeps.
func deletedOutcome(job *bkv1.BuildJob) *outcome {
	msg := "The operator stopped the job because its BuildJob was deleted in Kubernetes."
	if job.Annotations[bkv1.AnnotationStopReason] == bkv1.StopReasonUninstall {
		msg = "The operator stopped the job because the operator is being uninstalled: its drain deleted the job's BuildJob."
	}
	return &outcome{reason: bkv1.ReasonBuildJobDeleted, exitStatus: -1, signalReason: agentapi.SignalReasonAgentStop, message: msg, explanation: msg}
}

// observeDeleted handles a BuildJob being deleted before its finish was reported: the
// job is stopped (deletedOutcome). Its pod is deleted gracefully (a running command's
// supervisor sends SIGTERM, waits its grace period, then SIGKILL, and sends the last
// output), and the job is finished once the pod has stopped, whether or not its command
// had started: until then, it still could.
func (r *Reconciler) observeDeleted(ctx context.Context, s *scope) (*outcome, error) {
	job, pod := s.job, s.pod
	stop := deletedOutcome(job)
	if pod == nil {
		return stop, nil
	}
	stuck := !pod.DeletionTimestamp.IsZero() && s.now.After(pod.DeletionTimestamp.Add(r.opts.PodTerminationTimeout))
	if podstate.Stopped(pod) || stuck {
		return stoppedBy(pod, stop), nil
	}
	if pod.DeletionTimestamp.IsZero() {
		if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("deleting pod %s/%s to stop its job: %w", pod.Namespace, pod.Name, err)
		}
		r.event(job, pod, corev1.EventTypeNormal, EventCanceling, "Cancel", "BuildJob deleted: stopping pod %s", pod.Name)
	}
	s.requeueAfter(r.opts.PodTerminationTimeout)
	return nil, nil
}

// stoppedOutcome is the outcome of a pod that stopPod deleted before its command started,
// once it has stopped (nil for any other pod): the one stopPod kept in the status, unless
// the supervisor did start the job meanwhile, whose own record then says how it ended.
func stoppedOutcome(job *bkv1.BuildJob, pod *corev1.Pod) *outcome {
	stop := stopping(job)
	if stop == nil || (podstate.JobEnded(pod) == nil && podstate.JobRan(pod)) {
		return nil
	}
	return stoppedBy(pod, stop)
}

// stoppedBy is the outcome of a stopped pod that the operator stopped for stop's reason:
// stop itself if the job's command never started. If it did (the supervisor started the
// job after all, or a container that ran left no record), the pod's own outcome, with
// stop's reason and explanation first. A cancel on Buildkite keeps what the supervisor
// says of the command's end; a deleted BuildJob's stop is agent_stop, unless the
// supervisor had stopped the command for a cancel on Buildkite first, which stays cancel.
func stoppedBy(pod *corev1.Pod, stop *outcome) *outcome {
	var o *outcome
	switch t := podstate.JobEnded(pod); {
	case t == nil && podstate.JobRan(pod):
		// The container ran, but its record went with it.
		o = killed(stop.reason, stop.message, "SIGTERM", progressZero, true)
	case t != nil:
		o = fromTerminated(pod, podstate.Ended(pod))
		if !o.progress.Started {
			return stop
		}
		if stop.reason == bkv1.ReasonCanceled {
			o.reason, o.signalReason = bkv1.ReasonCanceled, agentapi.SignalReasonCancel
			if !o.progress.Exited {
				o.exitStatus, o.signal = -1, signalOr(t, "SIGTERM")
			}
			o.message = "The job was canceled on Buildkite; " + exitMessage(o.exitStatus, o.signal)
			return o
		}
		o.reason, o.message = stop.reason, stop.message
		o.explanation = joinLines(stop.explanation, o.explanation)
	default:
		return stop
	}
	if stop.signalReason == agentapi.SignalReasonAgentStop && o.signalReason != agentapi.SignalReasonCancel {
		o.signalReason = agentapi.SignalReasonAgentStop
		if !o.progress.Exited {
			o.exitStatus, o.signal = -1, "SIGTERM"
		}
	}
	return o
}

func joinLines(a, b string) string {
	switch {
	case a == "" || a == b:
		return b
	case b == "":
		return a
	}
	return a + "\n" + b
}

// watchRunning follows a job whose command runs. The supervisor stops the command when
// Buildkite cancels the job or times it out; in case it cannot (its node stopped
// responding, or it is stuck), the controller asks Buildkite too, every
// opts.RunningJobStateInterval. Once Buildkite has asked to stop the job, the supervisor
// has the pod's grace period, its own poll interval and opts.CancelMargin; past that, the
// pod is deleted and the job finished as canceled by the controller.
func (r *Reconciler) watchRunning(ctx context.Context, s *scope) (*outcome, error) {
	job, pod, now := s.job, s.pod, s.now
	poll := min(r.opts.ResyncInterval, r.opts.RunningJobStateInterval)
	state, ok, err := r.jobState(ctx, s)
	if err != nil || !ok || !state.Stopped() {
		if err == nil {
			s.requeueAfter(poll)
		}
		return nil, err
	}
	what := "cancel"
	if state.TimedOut() {
		what = "time out"
	}
	grace := podbuilder.DefaultGracePeriod
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	allowed := grace + r.opts.JobStatusInterval + r.opts.CancelMargin
	first := !conditionIs(job, bkv1.ConditionFinished, metav1.ConditionUnknown)
	var since time.Time
	// The condition, not status.message, which says the command runs while it does.
	err = r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
		since = waitingSince(job, bkv1.ConditionFinished, metav1.ConditionUnknown, bkv1.ReasonCanceled,
			fmt.Sprintf("Buildkite asked to %s the job: the supervisor has %s to stop the command, or the operator deletes the pod", what, allowed), now)
	})
	if err != nil {
		return nil, err
	}
	if first {
		r.event(job, pod, corev1.EventTypeNormal, EventCanceling, "Cancel", "Buildkite asked to %s the job; its supervisor has %s to stop the command", what, allowed)
	}
	if left := since.Add(allowed).Sub(now); left > 0 {
		s.requeueAfter(left, poll)
		return nil, nil
	}
	msg := fmt.Sprintf("Buildkite asked to %s the job, but its command was still running %s later: the supervisor did not stop it (the node running the pod may have stopped responding, or the supervisor is stuck). The operator deleted the job's pod and finished the job as canceled.",
		what, now.Sub(since).Round(time.Second))
	o := killed(bkv1.ReasonCanceled, msg, "SIGKILL", progressZero, true)
	o.signalReason, o.deletePod, o.buildkiteDone = agentapi.SignalReasonCancel, true, state.Terminal()
	return o, nil
}

// jobState asks Buildkite for the job's state, within the reconcile's Buildkite budget.
// A job token Buildkite no longer takes means the job was finished or canceled there: it
// reads as canceled. ok is false when the state is unknown: no token, or no answer (which
// is logged, not returned: the caller asks again on its next poll).
func (r *Reconciler) jobState(ctx context.Context, s *scope) (agentapi.JobState, bool, error) {
	bk, err := s.buildkite(ctx)
	if err != nil {
		return "", false, ignoreNoToken(err)
	}
	bctx, cancel := s.buildkiteContext(ctx)
	defer cancel()
	state, err := bk.JobState(bctx, s.job.Spec.JobID)
	switch {
	case isGone(err):
		return agentapi.JobStateCanceled, true, nil
	case err != nil:
		buildkiteErrors.WithLabelValues("job_state").Inc()
		log.FromContext(ctx).Info("reading the job's state from Buildkite failed; trying again later", "error", err.Error())
		return "", false, nil
	}
	return state, true, nil
}

// canceledBeforeStart asks Buildkite whether the job was canceled (or timed out) while its
// pod (none yet, when a quota holds it up) was not yet running the command.
func (r *Reconciler) canceledBeforeStart(ctx context.Context, s *scope) (*outcome, error) {
	if !s.pollDue() {
		return nil, nil
	}
	state, ok, err := r.jobState(ctx, s)
	if err != nil || !ok || !state.Stopped() {
		return nil, err
	}
	if !state.Terminal() && s.pod != nil {
		// Canceling means the job was started, so the supervisor may be running even if
		// the cache has not shown it yet: then the supervisor handles the cancel, with the
		// command's output. Only a pod that truly never ran it is stopped here.
		pod := &corev1.Pod{}
		err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(s.pod), pod)
		if err == nil && podstate.JobRan(pod) {
			return nil, nil
		}
	}
	what := "canceled"
	if state.TimedOut() {
		what = "timed out"
	}
	msg := fmt.Sprintf("The job was %s on Buildkite before its command started.", what)
	o := &outcome{reason: bkv1.ReasonCanceled, exitStatus: -1, signalReason: agentapi.SignalReasonCancel, message: msg, explanation: msg, deletePod: true}
	// A job Buildkite already ended takes no start, log or finish.
	o.buildkiteDone = state.Terminal()
	return o, nil
}

// pollDue says whether Buildkite is to be asked for the state of the job, whose command has
// not started: at most every opts.JobStatePollInterval, however many pod events come
// between (the reconcile of each pending pod asks to look again after that interval).
func (s *scope) pollDue() bool {
	if last := s.memory().polled; !last.IsZero() && s.now.Sub(last) < s.r.opts.JobStatePollInterval*9/10 {
		return false
	}
	s.remember(func(m *jobMemory) { m.polled = s.now })
	return true
}
