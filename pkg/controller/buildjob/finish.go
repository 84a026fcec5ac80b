package buildjob

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// finish records how the job ended and tells Buildkite, in this order:
//
//  1. stopPod: the pod stops whatever it is still doing; one whose command has not
//     started is waited for until it has stopped, so that it cannot start it after;
//  2. prepareBuildkite: Buildkite gets what must come before finish, the start of a job
//     whose command never started it and the explanation at the end of its log;
//  3. recordOutcome: the outcome is written to the status;
//  4. the pod is let go of, and report sends finish.
//
// Step 2 is repeated identically if a restart comes before step 3's write, and Buildkite
// drops a chunk it already has. Once the outcome is written, finish is sent exactly once.
func (r *Reconciler) finish(ctx context.Context, s *scope, o *outcome) error {
	job, pod := s.job, s.pod
	stillStopping, err := r.stopPod(ctx, s, o)
	if err != nil {
		return err
	}
	if stillStopping {
		// The pod's own updates bring the next reconcile sooner.
		s.requeueAfter(r.opts.PodTerminationTimeout)
		return nil
	}
	if o.finishedAt.IsZero() {
		o.finishedAt = s.now
	}
	if o.progress.Finished && o.explanation == "" {
		return r.finishedByPod(ctx, s, o)
	}
	explained, next, err := r.prepareBuildkite(ctx, s, o)
	if err != nil || next == waitForBuildkite {
		return err
	}
	if err := r.recordOutcome(ctx, s, o, explained, reporting); err != nil {
		return err
	}
	if !o.succeeded() {
		// How a job failed is what a person looks for in its events; one that passed says
		// so in its phase, and an event for each would be a write per job.
		r.event(job, pod, corev1.EventTypeWarning, o.reason, "Finish", "%s", o.message)
	}
	if pod != nil {
		if err := r.releasePod(ctx, pod); err != nil {
			return err
		}
	}
	switch {
	case next == leaveUnreported:
		return r.unreportable(ctx, s, o)
	case o.buildkiteDone:
		return r.markReported(ctx, s, o, bkv1.ReasonAlreadyFinished, "Buildkite had already ended the job", metav1.ConditionTrue)
	}
	return r.report(ctx, s, o, false)
}

// finishedByPod records the outcome of a job whose supervisor finished it on Buildkite
// itself, with all its output sent (jobprogress.Progress.Finished): nothing is left to
// send, so the outcome and the report are one status write, and the pod is let go of as
// a reported job's is (reap).
func (r *Reconciler) finishedByPod(ctx context.Context, s *scope, o *outcome) error {
	// A notice of what the job waited for that no reconcile removed while the command ran
	// (it ran between two): Buildkite may no longer take its removal; it is tried, as for
	// any job Buildkite has ended (prepareBuildkite). Nothing is done without a notice.
	if err := r.clearWait(ctx, s, jobEnded); err != nil {
		return err
	}
	err := r.recordOutcome(ctx, s, o, 0, func(job *bkv1.BuildJob) {
		job.Status.Times.ReportedAt = s.reportTime()
		setCondition(job, bkv1.ConditionReported, metav1.ConditionTrue, bkv1.ReasonReported,
			fmt.Sprintf("The job's supervisor finished the job on Buildkite with exit status %d", o.exitStatus))
	})
	if err != nil {
		return err
	}
	if !o.succeeded() {
		r.event(s.job, s.pod, corev1.EventTypeWarning, o.reason, "Finish", "%s", o.message)
	}
	return r.wasReported(ctx, s, o)
}

// stopPod deletes a pod that is still doing something (pulling, waiting to be scheduled)
// when the outcome says so, before anything is recorded, so a command cannot start after
// its job was given up.
//
// A pod on a node whose command has not started may still start it: the kubelet can be
// starting the job container as the deletion comes, and the cache shows a running
// container late. Finishing the job then would race its supervisor, which would start a
// job Buildkite has been told is over. So, unless Buildkite takes nothing more from the
// job anyway, the outcome is kept in the status (the Finished condition Unknown: see
// stopping) and finish waits (wait is true) until the pod has ended; observe then
// takes the outcome from there, or from the supervisor if it did start the job.
func (r *Reconciler) stopPod(ctx context.Context, s *scope, o *outcome) (wait bool, err error) {
	job, pod := s.job, s.pod
	if !o.deletePod || pod == nil || !pod.DeletionTimestamp.IsZero() {
		return false, nil
	}
	keep := !o.buildkiteDone && !o.progress.Started && !o.commandRan
	wait = keep && !podstate.Stopped(pod)
	if keep {
		// Kept before the delete even when finish goes on at once: if it is held up after
		// the delete (a stale cache, the token, Buildkite), the next reconcile finds the
		// pod deleted, which no longer says why, and takes the outcome from here. The
		// write also fails on a stale cached BuildJob, before anything is deleted.
		// The condition, not status.message, which follows the pod until the outcome.
		err := r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
			setCondition(job, bkv1.ConditionFinished, metav1.ConditionUnknown, o.reason, o.message)
		})
		if err != nil {
			return false, err
		}
	}
	if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
		return false, fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return wait, nil
}

// stopping is the outcome stopPod kept in the status of a job whose pod it is stopping
// before the command started, or nil.
func stopping(job *bkv1.BuildJob) *outcome {
	c := condition(job, bkv1.ConditionFinished)
	if c == nil || c.Status != metav1.ConditionUnknown {
		return nil
	}
	o := neverRan(c.Reason, c.Message, progressZero)
	switch c.Reason {
	case bkv1.ReasonCanceled:
		o.signalReason = agentapi.SignalReasonCancel
	case bkv1.ReasonBuildJobDeleted:
		o.signalReason = agentapi.SignalReasonAgentStop
	}
	return o
}

// afterPrepare is what finish does once prepareBuildkite has sent what must come first.
type afterPrepare int

const (
	// recordAndReport: the outcome is recorded, and Buildkite told (or it knows already).
	recordAndReport afterPrepare = iota
	// waitForBuildkite: finish goes no further this reconcile, which asks to look again
	// when it should: the cache is stale, or the token missing.
	waitForBuildkite
	// leaveUnreported: the job's token is gone for good, so Buildkite cannot be told: the
	// outcome is recorded and the job let go of without a finish (unreportable).
	leaveUnreported
)

// prepareBuildkite sends what Buildkite must have before the outcome is recorded: the start
// of a job whose command never started it, and the explanation at the end of its log. It
// returns how many bytes the explanation added to the log, and what finish does next.
func (r *Reconciler) prepareBuildkite(ctx context.Context, s *scope, o *outcome) (explained int64, next afterPrepare, err error) {
	if bkv1.MadeByHand(s.job) {
		return 0, recordAndReport, nil // no Buildkite job: report says so
	}
	if o.buildkiteDone {
		// Buildkite may no longer take the removal of the wait's notice; it is tried.
		return 0, recordAndReport, r.clearWait(ctx, s, jobEnded)
	}
	if sendsOnce(o) {
		if stale, err := r.waitForFreshCache(ctx, s); stale || err != nil {
			return 0, waitForBuildkite, err
		}
	}
	switch _, err := s.buildkite(ctx); {
	case errors.Is(err, errNoToken):
		giveUp, err := r.waitForToken(ctx, s, o)
		if !giveUp || err != nil {
			return 0, waitForBuildkite, err
		}
		return 0, leaveUnreported, nil
	case err != nil:
		return 0, recordAndReport, err
	}
	// The notice of what the job waited for goes before the job ends: Buildkite takes
	// no calls with the job's token after.
	if err := r.clearWait(ctx, s, jobEnded); err != nil {
		return 0, recordAndReport, err
	}
	if err := r.startNeverStarted(ctx, s, o); err != nil {
		return 0, recordAndReport, err
	}
	if o.buildkiteDone || o.explanation == "" {
		return 0, recordAndReport, nil
	}
	explained, err = r.explain(ctx, s, o)
	return explained, recordAndReport, err
}

// sendsOnce: Buildkite is to get something for o that must not be sent twice, the start
// of a job whose command never started it or an explanation in its log. Only then is the
// cached BuildJob checked against the API server (waitForFreshCache): the rest of what
// finish sends is sent after the outcome's write, which a stale copy cannot make.
func sendsOnce(o *outcome) bool {
	return o.explanation != "" || !(o.progress.Started || o.commandRan)
}

// waitForFreshCache checks the job against the API server. The cache can lag a status this
// controller wrote a moment ago, and acting on a stale copy would start the job or write
// its explanation on Buildkite a second time: stale says to wait for the cache, or that
// the BuildJob is gone.
func (r *Reconciler) waitForFreshCache(ctx context.Context, s *scope) (stale bool, err error) {
	fresh := &bkv1.BuildJob{}
	if err := r.apiReader.Get(ctx, s.key, fresh); err != nil {
		return true, client.IgnoreNotFound(err)
	}
	if fresh.ResourceVersion != s.job.ResourceVersion {
		s.requeueAfter(staleCacheRetry)
		return true, nil
	}
	return false, nil
}

// reporting records, with the outcome, that Buildkite is being told: the Reported
// condition Unknown, so that a reconcile that finds it knows finish may already have been
// sent, and asks Buildkite before sending it again.
func reporting(job *bkv1.BuildJob) {
	setCondition(job, bkv1.ConditionReported, metav1.ConditionUnknown, bkv1.ReasonReporting, "Telling Buildkite how the job ended")
}

// recordOutcome writes how the job ended to the status, with what report says of telling
// Buildkite (reporting, or that it knows), and the job's pod (nil when it is gone), which
// a job that ended quickly has not had written before (recordPod).
func (r *Reconciler) recordOutcome(ctx context.Context, s *scope, o *outcome, explained int64, report func(*bkv1.BuildJob)) error {
	job, pod := s.job, s.pod
	exit := int32(o.exitStatus)
	wasStarted := conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue)
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		if pod != nil {
			recordPodCreated(job, pod)
		}
		recordWarmStart(s, pod)
		st.ExitStatus = &exit
		st.Signal, st.SignalReason, st.Message = o.signal, o.signalReason, o.message
		st.Times.FinishedAt = &metav1.Time{Time: o.finishedAt}
		// The phase is final with the outcome, in the same write as Started and the
		// times, so that no reader sees them disagree; Reported says whether Buildkite
		// knows yet.
		st.Phase = phaseOf(o)
		recordStarted(job, o)
		if o.progressUnknown {
			// The log's length is unknown; keep what an earlier write recorded.
			explained = 0
		}
		st.Log = bkv1.LogProgress{
			Bytes:        int64(o.progress.Offset) + explained,
			Chunks:       int64(o.progress.Sequence),
			FailedChunks: int64(o.progress.FailedChunks),
		}
		if explained > 0 {
			st.Log.Chunks++
		}
		setCondition(job, bkv1.ConditionFinished, metav1.ConditionTrue, o.reason, o.message)
		report(job)
	})
	if err == nil && pod != nil {
		recordedPod(s, wasStarted)
	}
	return err
}

// Why the WaitShown condition is False: the command started, or the job ended.
const (
	commandStarted = "The job's command started."
	jobEnded       = "The job ended."
)

// staleCacheRetry is how soon a reconcile that found a stale cached BuildJob tries again.
const staleCacheRetry = 200 * time.Millisecond
