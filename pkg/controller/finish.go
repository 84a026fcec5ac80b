package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

var progressZero jobprogress.Progress

var errNoToken = errors.New("job token Secret missing")

// Where the explanation goes when the supervisor's progress was lost with its pod: beyond
// the sequence and offset of any log Buildkite keeps (its limit is 1 GiB), so it lands
// after whatever output did arrive instead of colliding with it.
const (
	unknownProgressSequence = 1 << 30
	unknownProgressOffset   = 1 << 40
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

// reap removes the finalizer of a reported job, deletes its pod after the retention for
// pods and the BuildJob after the retention for BuildJobs.
func (r *Reconciler) reap(ctx context.Context, job *bkv1.BuildJob) (ctrl.Result, error) {
	pod, err := r.getPod(ctx, job)
	if err != nil {
		return ctrl.Result{}, err
	}
	// The pod is let go of first: once the BuildJob's finalizer is gone, the BuildJob may
	// vanish and no reconcile would come back for the pod.
	if pod != nil {
		if err := r.releasePod(ctx, pod); err != nil {
			return ctrl.Result{}, err
		}
		if !job.DeletionTimestamp.IsZero() {
			if err := r.deletePod(ctx, job, pod); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if controllerutil.ContainsFinalizer(job, Finalizer) {
		controllerutil.RemoveFinalizer(job, Finalizer)
		if err := r.client.Update(ctx, job); err != nil {
			if apierrors.IsNotFound(err) {
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, fmt.Errorf("removing finalizer from BuildJob %s/%s: %w", job.Namespace, job.Name, err)
		}
	}
	if !job.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	env, err := r.getEnvironment(ctx, job.Namespace, validation.EnvironmentName(job, r.opts.DefaultBuildEnvironment))
	if err != nil {
		return ctrl.Result{}, err
	}
	var ret bkv1.Retention
	if env != nil {
		ret = env.Spec.Retention
	}
	podKeep := duration(ret.FailedPods, r.opts.FailedPodRetention)
	if job.Status.Phase == bkv1.PhaseSucceeded {
		podKeep = duration(ret.SucceededPods, 0)
	}
	jobKeep := duration(ret.BuildJobs, r.opts.BuildJobRetention)
	reportedAt := job.Status.Times.ReportedAt.Time
	now := r.opts.Now()

	var next time.Duration
	if pod != nil {
		if left := reportedAt.Add(podKeep).Sub(now); left > 0 {
			next = left
		} else if err := r.deletePod(ctx, job, pod); err != nil {
			return ctrl.Result{}, err
		}
	}
	if left := reportedAt.Add(jobKeep).Sub(now); left > 0 {
		return ctrl.Result{RequeueAfter: minPositive(next, left)}, nil
	}
	if err := r.deletePod(ctx, job, pod); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.client.Delete(ctx, job, client.Preconditions{UID: &job.UID}); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("deleting BuildJob %s/%s after its retention: %w", job.Namespace, job.Name, err)
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) deletePod(ctx context.Context, job *bkv1.BuildJob, pod *corev1.Pod) error {
	if pod == nil || !pod.DeletionTimestamp.IsZero() {
		return nil
	}
	if err := r.releasePod(ctx, pod); err != nil {
		return err
	}
	if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting pod %s/%s of a reported job: %w", pod.Namespace, pod.Name, err)
	}
	r.event(job, pod, corev1.EventTypeNormal, EventReaped, "DeletePod", "Deleted pod %s", pod.Name)
	return nil
}

// releasePod removes the operator's finalizer from a pod whose outcome is recorded. The
// patch carries the resourceVersion, so it cannot drop a finalizer someone else added
// meanwhile; on a conflict the pod is read again from the API server (the cache may lag).
func (r *Reconciler) releasePod(ctx context.Context, pod *corev1.Pod) error {
	for attempt := 0; ; attempt++ {
		if !controllerutil.ContainsFinalizer(pod, podbuilder.PodFinalizer) {
			return nil
		}
		patch := client.MergeFromWithOptions(pod.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(pod, podbuilder.PodFinalizer)
		err := r.client.Patch(ctx, pod, patch)
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err) && attempt < 5:
			if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
				return client.IgnoreNotFound(err)
			}
		default:
			return fmt.Errorf("removing finalizer from pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
}

// releaseOrphan lets go of the pod of a BuildJob that no longer exists (its finalizer was
// removed by hand), so the pod does not wait for the operator forever.
func (r *Reconciler) releaseOrphan(ctx context.Context, key types.NamespacedName) error {
	pod := &corev1.Pod{}
	podKey := types.NamespacedName{Namespace: key.Namespace, Name: podbuilder.PodName(&bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Name: key.Name}})}
	if err := r.client.Get(ctx, podKey, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "BuildJob" || owner.Name != key.Name || !controllerutil.ContainsFinalizer(pod, podbuilder.PodFinalizer) {
		return nil
	}
	return r.releasePod(ctx, pod)
}

// token reads the job token from its Secret, straight from the API server: the operator
// does not cache Secrets. errNoToken: the Secret or its key does not exist (yet).
func (r *Reconciler) token(ctx context.Context, job *bkv1.BuildJob) (string, error) {
	ref := job.Spec.TokenSecretRef
	key := ref.KeyOrDefault()
	var s corev1.Secret
	err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: ref.Name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("%w: waiting for Secret %q with the job token (spec.tokenSecretRef)", errNoToken, ref.Name)
	case err != nil:
		return "", fmt.Errorf("reading the job token Secret %s/%s: %w", job.Namespace, ref.Name, err)
	}
	tok := string(s.Data[key])
	if tok == "" {
		return "", fmt.Errorf("%w: Secret %q has no key %q with the job token", errNoToken, ref.Name, key)
	}
	return tok, nil
}

// agentClient is a Buildkite client with the job's token, or nil when the token's Secret
// is missing.
func (r *Reconciler) agentClient(ctx context.Context, job *bkv1.BuildJob) (*agentapi.Client, error) {
	tok, err := r.token(ctx, job)
	if errors.Is(err, errNoToken) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	conf := r.opts.AgentAPI
	conf.Token = tok
	conf.Endpoint = job.Spec.AgentEndpoint
	if conf.Endpoint == "" {
		conf.Endpoint = r.opts.AgentEndpoint
	}
	return agentapi.New(conf), nil
}

func (r *Reconciler) waitForToken(ctx context.Context, job *bkv1.BuildJob) (ctrl.Result, error) {
	_, err := r.token(ctx, job)
	msg := "the job token Secret is missing"
	if err != nil {
		msg = err.Error()
	}
	r.event(job, nil, corev1.EventTypeWarning, bkv1.ReasonWaitingForTokenSecret, "Report", "Cannot tell Buildkite how the job ended: %s", msg)
	return ctrl.Result{RequeueAfter: 10 * r.opts.JobStatePollInterval}, nil
}

// isGone: Buildkite refused a job call because the job is already finished or canceled
// (422), or its job token is no longer valid, which it stops being when the job ends (401).
func isGone(err error) bool {
	return err != nil && (agentapi.IsAlreadyFinished(err) || agentapi.IsUnauthorized(err))
}

func duration(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
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
