package buildjob

import (
	"context"
	"fmt"
	"time"

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
	if job.Status.Times.AcceptedAt == nil {
		// Carried in by the spawner's annotation, with this write rather than one of its own.
		if t, err := time.Parse(time.RFC3339Nano, job.Annotations[bkv1.AnnotationAcceptedAt]); err == nil {
			job.Status.Times.AcceptedAt = &metav1.Time{Time: t}
		}
	}
	if err := r.client.Status().Update(ctx, job); err != nil {
		job.Status = *before
		return fmt.Errorf("updating status of BuildJob %s/%s: %w", job.Namespace, job.Name, err)
	}
	return nil
}

// recordStarted makes the Started condition and status.times.startedAt say what the
// outcome says: whether the job's command ran. The pod may have shown a running job
// container whose supervisor then never started the job, or the container may have ended
// before any reconcile saw it running; the outcome, read from the supervisor's own record,
// is the last word either way.
func recordStarted(job *bkv1.BuildJob, o *outcome) {
	st := &job.Status
	if !o.progress.Started && !o.commandRan {
		st.Times.StartedAt = nil
		setCondition(job, bkv1.ConditionStarted, metav1.ConditionFalse, bkv1.ReasonNeverRan, "The job's command never ran")
		return
	}
	if st.Times.StartedAt == nil {
		// A container that ended unseen started when its status says; a pod that vanished
		// with its status leaves only the end.
		at := o.startedAt
		if at.IsZero() {
			at = o.finishedAt
		}
		st.Times.StartedAt = &metav1.Time{Time: at}
	}
	setCondition(job, bkv1.ConditionStarted, metav1.ConditionTrue, bkv1.ReasonCommandRan, "The job's command ran")
}

// waitingSince records in condition t that the job waits, for reason, and returns since
// when it has: a condition that said something else before starts the wait now, while
// one that already said reason keeps its time, so the bound of a wait holds across
// reconciles and restarts. Call it inside updateStatus's change.
func waitingSince(job *bkv1.BuildJob, t string, s metav1.ConditionStatus, reason, message string, now time.Time) time.Time {
	if c := condition(job, t); c != nil && (c.Status != s || c.Reason != reason) {
		meta.RemoveStatusCondition(&job.Status.Conditions, t)
	}
	meta.SetStatusCondition(&job.Status.Conditions, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: message,
		ObservedGeneration: job.Generation, LastTransitionTime: metav1.NewTime(now),
	})
	return storedTime(condition(job, t).LastTransitionTime)
}

// storedTime is t as the API server keeps it, to the second, rounded up: a bound measured
// from it is never shorter than asked, whether t was just set or read back.
func storedTime(t metav1.Time) time.Time {
	return t.Time.Truncate(time.Second).Add(time.Second)
}
