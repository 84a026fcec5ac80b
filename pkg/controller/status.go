package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Event reasons that are not condition reasons.
const (
	EventCanceling = "Canceling"
	EventReaped    = "Reaped"
	EventFailed    = "ReconcileFailed"
)

func condition(job *bkv1.BuildJob, t string) *metav1.Condition {
	return meta.FindStatusCondition(job.Status.Conditions, t)
}

func conditionIs(job *bkv1.BuildJob, t string, s metav1.ConditionStatus) bool {
	c := condition(job, t)
	return c != nil && c.Status == s
}

// finished: how the job ended is recorded (it may not be reported yet).
func finished(job *bkv1.BuildJob) bool {
	return conditionIs(job, bkv1.ConditionFinished, metav1.ConditionTrue)
}

// reported: Buildkite has been told, or can no longer be; nothing more is sent.
func reported(job *bkv1.BuildJob) bool { return job.Status.Times.ReportedAt != nil }

func setCondition(job *bkv1.BuildJob, t string, s metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&job.Status.Conditions, metav1.Condition{
		Type:               t,
		Status:             s,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: job.Generation,
	})
}

// updateStatus applies change to job's status and writes it, unless nothing changed. The
// write carries the resourceVersion read, so a reconcile that acted on a stale copy fails
// with a conflict and is retried on fresh data instead of overwriting what it did not see.
func (r *Reconciler) updateStatus(ctx context.Context, job *bkv1.BuildJob, change func(st *bkv1.BuildJobStatus)) error {
	before := job.Status.DeepCopy()
	change(&job.Status)
	job.Status.ObservedGeneration = job.Generation
	if equality.Semantic.DeepEqual(before, &job.Status) {
		return nil
	}
	if err := r.client.Status().Update(ctx, job); err != nil {
		job.Status = *before
		return fmt.Errorf("updating status of BuildJob %s/%s: %w", job.Namespace, job.Name, err)
	}
	return nil
}

func (r *Reconciler) now() *metav1.Time {
	t := metav1.NewTime(r.opts.Now())
	return &t
}

// event records a Kubernetes event about job, and its pod when there is one.
func (r *Reconciler) event(job *bkv1.BuildJob, pod *corev1.Pod, eventType, reason, action, note string, args ...any) {
	var related runtime.Object
	if pod != nil {
		related = pod
	}
	r.recorder.Eventf(job, related, eventType, reason, action, note, args...)
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
