package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

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

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// getPod returns job's pod, or nil when it does not exist. A pod the cache has not seen
// yet is looked up in the API server before it is taken for gone, so a cache that lags
// behind a create never makes the controller think the pod was deleted.
func (r *Reconciler) getPod(ctx context.Context, job *bkv1.BuildJob) (*corev1.Pod, error) {
	name := job.Status.PodName
	if name == "" {
		name = podbuilder.PodName(job)
	}
	key := types.NamespacedName{Namespace: job.Namespace, Name: name}
	pod := &corev1.Pod{}
	err := r.client.Get(ctx, key, pod)
	if apierrors.IsNotFound(err) && conditionIs(job, bkv1.ConditionPodCreated, metav1.ConditionTrue) {
		err = r.apiReader.Get(ctx, key, pod)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting pod %s: %w", key, err)
	}
	if !metav1.IsControlledBy(pod, job) {
		return nil, fmt.Errorf("pod %s exists but does not belong to BuildJob %s (uid %s): delete it so the job's own pod can be created", key, job.Name, job.UID)
	}
	return pod, nil
}

// observe looks at the job's pod and either returns how the job ended, or brings the
// BuildJob's status up to date and says when to look again.
func (r *Reconciler) observe(ctx context.Context, job *bkv1.BuildJob, pod *corev1.Pod) (*outcome, ctrl.Result, error) {
	now := r.opts.Now()
	if !job.DeletionTimestamp.IsZero() {
		return r.observeDeleted(ctx, job, pod)
	}
	if pod == nil {
		if conditionIs(job, bkv1.ConditionPodCreated, metav1.ConditionTrue) {
			ran := conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue)
			when := "before the job's command started"
			if ran {
				when = "while the job was running"
			}
			o := killed(bkv1.ReasonPodDeleted, fmt.Sprintf("The job's pod %s disappeared %s, without the operator seeing how it ended.", job.Status.PodName, when), "SIGKILL", progressZero, ran)
			return o, ctrl.Result{}, nil
		}
		return r.createPod(ctx, job)
	}
	if err := r.recordPod(ctx, job, pod); err != nil {
		return nil, ctrl.Result{}, err
	}

	if !pod.DeletionTimestamp.IsZero() {
		stuck := now.After(pod.DeletionTimestamp.Add(r.opts.PodTerminationTimeout))
		if jobTerminated(pod) != nil || !jobEverRan(pod) || podEnded(pod) || stuck {
			return fromDeletedPod(pod, stuck), ctrl.Result{}, nil
		}
		wait := pod.DeletionTimestamp.Add(r.opts.PodTerminationTimeout).Sub(now)
		return nil, ctrl.Result{RequeueAfter: max(wait, time.Second)}, nil
	}
	if t := jobTerminated(pod); t != nil {
		return fromTerminated(pod, t), ctrl.Result{}, nil
	}
	switch pod.Status.Phase {
	case corev1.PodFailed:
		return fromFailedPod(pod), ctrl.Result{}, nil
	case corev1.PodSucceeded:
		return neverRan(bkv1.ReasonPodFailed, "The job's pod ended without a status for its job container, so how the job ended is unknown.", progressZero), ctrl.Result{}, nil
	case corev1.PodUnknown:
		detail := pod.Status.Message
		if detail == "" {
			detail = "its kubelet stopped reporting the pod's state"
		}
		o := killed(bkv1.ReasonNodeLost, nodeLostMessage(pod, detail), "SIGKILL", progressZero, jobEverRan(pod))
		o.deletePod = true
		return o, ctrl.Result{}, nil
	}
	if jobRunning(pod) != nil {
		return nil, ctrl.Result{RequeueAfter: r.opts.ResyncInterval}, nil
	}

	// The command has not started: look for what keeps it from starting.
	o, waitImage := waitingFailure(pod, r.opts.ImagePullGrace, now)
	if o == nil {
		var waitSched time.Duration
		o, waitSched = unschedulable(pod, r.opts.UnschedulableTimeout, now)
		waitImage = minPositive(waitImage, waitSched)
	}
	if o != nil {
		o.deletePod = true
		return o, ctrl.Result{}, nil
	}
	// Until the supervisor runs, nothing else notices a cancel on Buildkite.
	o, err := r.canceledBeforeStart(ctx, job)
	if err != nil || o != nil {
		return o, ctrl.Result{}, err
	}
	return nil, ctrl.Result{RequeueAfter: minPositive(r.opts.JobStatePollInterval, waitImage)}, nil
}

// observeDeleted handles a BuildJob being deleted before its finish was reported: the
// job is canceled. A running command is stopped by deleting its pod gracefully (the
// supervisor sends SIGTERM, waits its grace period, then SIGKILL, and sends the last
// output); the job is finished once the pod has ended.
func (r *Reconciler) observeDeleted(ctx context.Context, job *bkv1.BuildJob, pod *corev1.Pod) (*outcome, ctrl.Result, error) {
	const msg = "The job's BuildJob was deleted in Kubernetes, so the job was canceled."
	if pod == nil || !jobEverRan(pod) {
		o := &outcome{reason: bkv1.ReasonBuildJobDeleted, exitStatus: -1, signalReason: agentapi.SignalReasonCancel,
			message: msg, explanation: msg, deletePod: pod != nil}
		return o, ctrl.Result{}, nil
	}
	stuck := !pod.DeletionTimestamp.IsZero() && r.opts.Now().After(pod.DeletionTimestamp.Add(r.opts.PodTerminationTimeout))
	if t := jobTerminated(pod); t != nil || podEnded(pod) || stuck {
		var o outcome
		if t != nil {
			o = *fromTerminated(pod, t)
		}
		o.reason, o.message, o.explanation, o.signalReason = bkv1.ReasonBuildJobDeleted, msg, msg, agentapi.SignalReasonCancel
		if !o.progress.Exited {
			o.exitStatus, o.signal = -1, "SIGTERM"
		}
		if !o.progress.Flushed && o.progress.Started {
			o.explanation += "\nSome of the job's output may be missing above: its container ended before all of it was sent."
		}
		return &o, ctrl.Result{}, nil
	}
	if pod.DeletionTimestamp.IsZero() {
		if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
			return nil, ctrl.Result{}, fmt.Errorf("deleting pod %s/%s to cancel its job: %w", pod.Namespace, pod.Name, err)
		}
		r.event(job, pod, corev1.EventTypeNormal, EventCanceling, "Cancel", "BuildJob deleted: stopping pod %s", pod.Name)
	}
	return nil, ctrl.Result{RequeueAfter: r.opts.PodTerminationTimeout}, nil
}

// canceledBeforeStart asks Buildkite whether the job was canceled (or timed out) while its
// pod was not yet running the command.
func (r *Reconciler) canceledBeforeStart(ctx context.Context, job *bkv1.BuildJob) (*outcome, error) {
	bk, err := r.agentClient(ctx, job)
	if err != nil || bk == nil {
		return nil, err
	}
	state, err := bk.JobState(ctx, job.Spec.JobID)
	switch {
	case isGone(err):
		// The job token no longer works: the job was finished or canceled on Buildkite.
		state = agentapi.JobStateCanceled
	case err != nil:
		buildkiteErrors.WithLabelValues("job_state").Inc()
		log.FromContext(ctx).Info("reading the job's state from Buildkite failed; trying again later", "error", err.Error())
		return nil, nil
	}
	if !state.Stopped() {
		return nil, nil
	}
	if !state.Terminal() {
		// Canceling means the job was started, so the supervisor may be running even if
		// the cache has not shown it yet: then the supervisor handles the cancel, with the
		// command's output. Only a pod that truly never ran it is stopped here.
		pod := &corev1.Pod{}
		err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: job.Status.PodName}, pod)
		if err == nil && jobEverRan(pod) {
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

func podEnded(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

func condIsTrue(pod *corev1.Pod, t corev1.PodConditionType) bool {
	c := podCondition(pod, t)
	return c != nil && c.Status == corev1.ConditionTrue
}

func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}
