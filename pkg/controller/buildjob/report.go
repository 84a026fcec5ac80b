package buildjob

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

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

// startNeverStarted starts on Buildkite a job whose command never started it, so that it
// can take an explanation and a finish. Buildkite having ended the job already is noted
// in o.buildkiteDone.
func (r *Reconciler) startNeverStarted(ctx context.Context, s *scope, o *outcome) error {
	if o.progress.Started || o.commandRan {
		return nil
	}
	bk, err := s.buildkite(ctx)
	if err != nil {
		return err
	}
	job := s.job
	at := o.startedAt
	if at.IsZero() {
		at = o.finishedAt
	}
	bctx, cancel := s.buildkiteContext(ctx)
	defer cancel()
	err = bk.Start(bctx, job.Spec.JobID, at)
	switch {
	case isGone(err):
		o.buildkiteDone = true
	case err != nil:
		return unavailable("start", "starting job "+job.Spec.JobID+" on Buildkite to report it", err)
	}
	return nil
}

// explain appends the outcome's explanation to the job's log, as the chunk after the
// supervisor's last, and returns how many bytes it added. A chunk Buildkite refuses
// counts in o.progress.FailedChunks; Buildkite having ended the job is noted in
// o.buildkiteDone.
func (r *Reconciler) explain(ctx context.Context, s *scope, o *outcome) (int64, error) {
	bk, err := s.buildkite(ctx)
	if err != nil {
		return 0, err
	}
	job := s.job
	text := explanationText(o)
	seq, offset := o.progress.Sequence+1, o.progress.Offset
	if o.progressUnknown || (o.progress.Started && !o.progress.Flushed) {
		// Anything at the start of the log could collide with a chunk the supervisor
		// sent; and a supervisor that did not get to flush its log (killed, or its pod
		// taken away) may have had chunks on their way past its last record (it sends
		// up to two at once), one of which Buildkite would keep in place of the
		// explanation at the next sequence. Past any log a job can have, it cannot
		// collide.
		seq, offset = unknownProgressSequence, unknownProgressOffset
	}
	bctx, cancel := s.buildkiteContext(ctx)
	defer cancel()
	err = bk.UploadChunk(bctx, job.Spec.JobID, seq, offset, text)
	switch {
	case err == nil:
		return int64(len(text)), nil
	case isGone(err):
		o.buildkiteDone = true
	case agentapi.IsPermanent(err):
		buildkiteErrors.WithLabelValues("chunks").Inc()
		log.FromContext(ctx).Info("Buildkite refused the explanation for the job's log", "error", err.Error())
		o.progress.FailedChunks++
	default:
		return 0, unavailable("chunks", "writing the explanation into job "+job.Spec.JobID+"'s log", err)
	}
	return 0, nil
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

// report sends finish. resumed says an earlier reconcile recorded the outcome and may have
// sent finish already (the operator restarted, or a status write failed): Buildkite is
// asked for the job's state first, so it is not finished twice.
func (r *Reconciler) report(ctx context.Context, s *scope, o *outcome, resumed bool) error {
	job := s.job
	if bkv1.MadeByHand(job) {
		return r.markReported(ctx, s, o, bkv1.ReasonMadeByHand,
			"The BuildJob was made by hand, not from a Buildkite job: nothing is reported to Buildkite", metav1.ConditionFalse)
	}
	bk, err := s.buildkite(ctx)
	if errors.Is(err, errNoToken) {
		giveUp, err := r.waitForToken(ctx, s, o)
		if !giveUp || err != nil {
			return err
		}
		return r.unreportable(ctx, s, o)
	}
	if err != nil {
		return err
	}
	bctx, cancel := s.buildkiteContext(ctx)
	defer cancel()
	if resumed {
		state, err := bk.JobState(bctx, job.Spec.JobID)
		if isGone(err) || (err == nil && state.Terminal()) {
			return r.markReported(ctx, s, o, bkv1.ReasonAlreadyFinished, "Buildkite had already recorded the job's finish", metav1.ConditionTrue)
		}
	}
	err = bk.Finish(bctx, job.Spec.JobID, agentapi.Finish{
		ExitStatus:        o.exitStatus,
		Signal:            o.signal,
		SignalReason:      o.signalReason,
		ChunksFailedCount: o.progress.FailedChunks,
		FinishedAt:        o.finishedAt,
	})
	switch {
	case err == nil:
		return r.markReported(ctx, s, o, bkv1.ReasonReported, fmt.Sprintf("Buildkite accepted exit status %d", o.exitStatus), metav1.ConditionTrue)
	case isGone(err):
		return r.markReported(ctx, s, o, bkv1.ReasonAlreadyFinished, "Buildkite had already finished or canceled the job", metav1.ConditionTrue)
	case agentapi.IsPermanent(err):
		buildkiteErrors.WithLabelValues("finish").Inc()
		return r.markReported(ctx, s, o, bkv1.ReasonFinishRejected, "Buildkite refused the job's finish: "+err.Error(), metav1.ConditionFalse)
	}
	return unavailable("finish", "finishing job "+job.Spec.JobID+" on Buildkite", err)
}

// markReported records that Buildkite has been told (or cannot be), which frees the
// spawner's slot (it watches status.times.reportedAt), and lets the BuildJob go.
func (r *Reconciler) markReported(ctx context.Context, s *scope, o *outcome, reason, message string, status metav1.ConditionStatus) error {
	job := s.job
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		st.Phase = phaseOf(o)
		st.Times.ReportedAt = s.reportTime()
		setCondition(job, bkv1.ConditionReported, status, reason, message)
	})
	if err != nil {
		return err
	}
	if status != metav1.ConditionTrue {
		// A report that went as it should needs no event: the status says so.
		r.event(job, nil, corev1.EventTypeWarning, reason, "Report", "%s", message)
	}
	return r.wasReported(ctx, s, o)
}

// wasReported counts a job whose report is recorded, and reaps it. Buildkite is told: the
// job's client is dropped, as no more calls are made.
func (r *Reconciler) wasReported(ctx context.Context, s *scope, o *outcome) error {
	job := s.job
	s.remember(func(m *jobMemory) { m.client, m.created, m.gone, m.reported = nil, false, nil, job.UID })
	jobsFinished.WithLabelValues(o.reason).Inc()
	logBytes.Add(float64(job.Status.Log.Bytes))
	logChunksFailed.Add(float64(job.Status.Log.FailedChunks))
	if ft := job.Status.Times.FinishedAt; ft != nil {
		finishLatencySeconds.Observe(job.Status.Times.ReportedAt.Sub(ft.Time).Seconds())
	}
	return r.reap(ctx, s)
}
