package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// finish records how the job ended and tells Buildkite. Before the outcome is written to
// the status it starts the job (when the command never started it) and appends the
// explanation to the log; both are repeated identically if a restart comes before the
// write, and Buildkite drops a chunk it already has. Once the outcome is written, finish
// is called exactly once (report).
func (r *Reconciler) finish(ctx context.Context, job *bkv1.BuildJob, pod *corev1.Pod, o *outcome) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	if o.deletePod && pod != nil && pod.DeletionTimestamp.IsZero() {
		// Stop whatever the pod is still doing (pulling, waiting to be scheduled) first,
		// so a command cannot start after its job was given up.
		if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	if o.finishedAt.IsZero() {
		o.finishedAt = r.opts.Now()
	}

	failedChunks := o.progress.FailedChunks
	explained := int64(0)
	if !o.buildkiteDone {
		// The cache can lag a status this controller wrote a moment ago. Acting on a stale
		// copy would start the job or write its explanation on Buildkite a second time, so
		// check the copy against the API server first and wait for the cache if it is old.
		fresh := &bkv1.BuildJob{}
		if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(job), fresh); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		if fresh.ResourceVersion != job.ResourceVersion {
			return ctrl.Result{RequeueAfter: staleCacheRetry}, nil
		}
		bk, err := r.agentClient(ctx, job)
		if err != nil {
			return ctrl.Result{}, err
		}
		if bk == nil {
			return r.waitForToken(ctx, job)
		}
		if !o.progress.Started && !o.commandRan {
			at := o.startedAt
			if at.IsZero() {
				at = o.finishedAt
			}
			err := bk.Start(ctx, job.Spec.JobID, at)
			switch {
			case isGone(err):
				o.buildkiteDone = true
			case err != nil:
				buildkiteErrors.WithLabelValues("start").Inc()
				return ctrl.Result{}, fmt.Errorf("starting job %s on Buildkite to report it: %w", job.Spec.JobID, err)
			}
		}
		if !o.buildkiteDone && o.explanation != "" {
			text := explanationText(o)
			seq, offset := o.progress.Sequence+1, o.progress.Offset
			if o.progressUnknown {
				// Anything at the start of the log could collide with a chunk the
				// supervisor sent: put the explanation past any log a job can have.
				seq, offset = unknownProgressSequence, unknownProgressOffset
			}
			err := bk.UploadChunk(ctx, job.Spec.JobID, seq, offset, text)
			switch {
			case err == nil:
				explained = int64(len(text))
			case isGone(err):
				o.buildkiteDone = true
			case agentapi.IsPermanent(err):
				buildkiteErrors.WithLabelValues("chunks").Inc()
				logger.Info("Buildkite refused the explanation for the job's log", "error", err.Error())
				failedChunks++
			default:
				buildkiteErrors.WithLabelValues("chunks").Inc()
				return ctrl.Result{}, fmt.Errorf("writing the explanation into job %s's log: %w", job.Spec.JobID, err)
			}
		}
	}

	o.progress.FailedChunks = failedChunks
	exit := int32(o.exitStatus)
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		st.ExitStatus = &exit
		st.Signal, st.SignalReason, st.Message = o.signal, o.signalReason, o.message
		if st.Times.StartedAt == nil && !o.startedAt.IsZero() {
			st.Times.StartedAt = &metav1.Time{Time: o.startedAt}
		}
		st.Times.FinishedAt = &metav1.Time{Time: o.finishedAt}
		if o.progressUnknown {
			// The log's length is unknown; keep what an earlier write recorded.
			explained = 0
		}
		st.Log = bkv1.LogProgress{
			Bytes:        int64(o.progress.Offset) + explained,
			Chunks:       int64(o.progress.Sequence),
			FailedChunks: int64(failedChunks),
		}
		if explained > 0 {
			st.Log.Chunks++
		}
		if !conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue) {
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionFalse, bkv1.ReasonNeverRan, "The job's command never ran")
		}
		setCondition(job, bkv1.ConditionFinished, metav1.ConditionTrue, o.reason, o.message)
		// Written before finish is called: a reconcile that finds it knows finish may
		// already have been sent, and asks Buildkite before sending it again.
		setCondition(job, bkv1.ConditionReported, metav1.ConditionUnknown, bkv1.ReasonReporting, "Telling Buildkite how the job ended")
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	eventType := corev1.EventTypeNormal
	if !o.succeeded() {
		eventType = corev1.EventTypeWarning
	}
	r.event(job, pod, eventType, o.reason, "Finish", "%s", o.message)
	if pod != nil {
		if err := r.releasePod(ctx, pod); err != nil {
			return ctrl.Result{}, err
		}
	}
	if o.buildkiteDone {
		return r.markReported(ctx, job, o, bkv1.ReasonAlreadyFinished, "Buildkite had already ended the job", metav1.ConditionTrue)
	}
	return r.report(ctx, job, o, false)
}

// staleCacheRetry is how soon a reconcile that found a stale cached BuildJob tries again.
const staleCacheRetry = 200 * time.Millisecond
