package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
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
