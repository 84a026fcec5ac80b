package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Where the explanation goes when the supervisor's progress was lost with its pod: beyond
// the sequence and offset of any log Buildkite keeps (its limit is 1 GiB), so it lands
// after whatever output did arrive instead of colliding with it.
const (
	unknownProgressSequence = 1 << 30
	unknownProgressOffset   = 1 << 40
)

// report sends finish. resumed says an earlier reconcile recorded the outcome and may have
// sent finish already (the operator restarted, or a status write failed): Buildkite is
// asked for the job's state first, so it is not finished twice.
func (r *Reconciler) report(ctx context.Context, job *bkv1.BuildJob, o *outcome, resumed bool) (ctrl.Result, error) {
	bk, err := r.agentClient(ctx, job)
	if err != nil {
		return ctrl.Result{}, err
	}
	if bk == nil {
		if !job.DeletionTimestamp.IsZero() {
			// Nothing can ever reach Buildkite without the token: let the BuildJob go.
			return r.markReported(ctx, job, o, bkv1.ReasonFinishRejected, "The job token Secret is gone, so Buildkite could not be told how the job ended", metav1.ConditionFalse)
		}
		return r.waitForToken(ctx, job)
	}
	if resumed {
		state, err := bk.JobState(ctx, job.Spec.JobID)
		if isGone(err) || (err == nil && state.Terminal()) {
			return r.markReported(ctx, job, o, bkv1.ReasonAlreadyFinished, "Buildkite had already recorded the job's finish", metav1.ConditionTrue)
		}
	}
	err = bk.Finish(ctx, job.Spec.JobID, agentapi.Finish{
		ExitStatus:        o.exitStatus,
		Signal:            o.signal,
		SignalReason:      o.signalReason,
		ChunksFailedCount: o.progress.FailedChunks,
		FinishedAt:        o.finishedAt,
	})
	switch {
	case err == nil:
		return r.markReported(ctx, job, o, bkv1.ReasonReported, fmt.Sprintf("Buildkite accepted exit status %d", o.exitStatus), metav1.ConditionTrue)
	case isGone(err):
		return r.markReported(ctx, job, o, bkv1.ReasonAlreadyFinished, "Buildkite had already finished or canceled the job", metav1.ConditionTrue)
	case agentapi.IsPermanent(err):
		buildkiteErrors.WithLabelValues("finish").Inc()
		return r.markReported(ctx, job, o, bkv1.ReasonFinishRejected, "Buildkite refused the job's finish: "+err.Error(), metav1.ConditionFalse)
	default:
		buildkiteErrors.WithLabelValues("finish").Inc()
		return ctrl.Result{}, fmt.Errorf("finishing job %s on Buildkite: %w", job.Spec.JobID, err)
	}
}

// markReported records that Buildkite has been told (or cannot be), which frees the
// spawner's slot (it watches status.times.reportedAt), and lets the BuildJob go.
func (r *Reconciler) markReported(ctx context.Context, job *bkv1.BuildJob, o *outcome, reason, message string, status metav1.ConditionStatus) (ctrl.Result, error) {
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		st.Phase = phaseOf(o)
		st.Times.ReportedAt = r.now()
		setCondition(job, bkv1.ConditionReported, status, reason, message)
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	jobsFinished.WithLabelValues(o.reason).Inc()
	logBytes.Add(float64(job.Status.Log.Bytes))
	logChunksFailed.Add(float64(job.Status.Log.FailedChunks))
	if ft := job.Status.Times.FinishedAt; ft != nil {
		finishLatencySeconds.Observe(job.Status.Times.ReportedAt.Sub(ft.Time).Seconds())
	}
	eventType := corev1.EventTypeNormal
	if status != metav1.ConditionTrue {
		eventType = corev1.EventTypeWarning
	}
	r.event(job, nil, eventType, reason, "Report", "%s", message)
	return r.reap(ctx, job)
}

// explanationText is what is appended to the Buildkite log: a section a person finds at the
// end of the log, starting on a line of its own.
func explanationText(o *outcome) []byte {
	text := "+++ :kubernetes: buildkite-operator\n" + o.explanation + "\n"
	if o.progress.Offset > 0 {
		text = "\n" + text
	}
	return []byte(text)
}
