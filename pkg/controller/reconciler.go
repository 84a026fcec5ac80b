package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite,resources=buildjobs,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite,resources=buildjobs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite,resources=buildjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite,resources=buildenvironments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=pods,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=secrets,verbs=get
// +kubebuilder:rbac:groups=events.k8s.io,namespace=buildkite,resources=events,verbs=create;patch

// Reconciler reconciles BuildJobs. Make one with Setup.
type Reconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	opts      Options
}

// SetupOptions are for callers that run more than one manager in a process (tests that
// restart the controller): controller-runtime refuses a second controller of one name.
type SetupOptions struct {
	SkipNameValidation bool
}

// Setup registers the BuildJob controller with mgr. It watches BuildJobs and the pods they
// own.
func Setup(mgr ctrl.Manager, opts Options, setup ...SetupOptions) error {
	opts = opts.withDefaults()
	rec := opts.Recorder
	if rec == nil {
		rec = mgr.GetEventRecorder("buildkite-operator")
	}
	r := &Reconciler{client: mgr.GetClient(), apiReader: mgr.GetAPIReader(), recorder: rec, opts: opts}
	// The classic rate-limited queue: controller-runtime v0.23.1's priority queue can
	// deadlock while the manager stops (a worker in Done waits for the lock its handout
	// loop holds while blocked sending to workers that have already exited), so a restart
	// of the operator would hang until the shutdown grace period ran out.
	noPriorityQueue := false
	copts := controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, UsePriorityQueue: &noPriorityQueue}
	for _, s := range setup {
		if s.SkipNameValidation {
			skip := true
			copts.SkipNameValidation = &skip
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&bkv1.BuildJob{}).
		Owns(&corev1.Pod{}).
		Named("buildjob").
		WithOptions(copts).
		Complete(r)
}

// Reconcile converges one BuildJob.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	started := time.Now()
	defer func() {
		outcome := "done"
		switch {
		case err != nil:
			outcome = "error"
		case res.RequeueAfter > 0:
			outcome = "requeue"
		}
		reconcileTotal.WithLabelValues(outcome).Inc()
		reconcileDuration.WithLabelValues(outcome).Observe(time.Since(started).Seconds())
	}()
	job := &bkv1.BuildJob{}
	if err := r.client.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, r.releaseOrphan(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	res, err = r.reconcile(ctx, job)
	if apierrors.IsConflict(err) {
		// Someone (often this controller, a moment ago) changed the object: read it again.
		log.FromContext(ctx).V(1).Info("conflict, retrying", "error", err.Error())
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, job *bkv1.BuildJob) (ctrl.Result, error) {
	if reported(job) {
		return r.reap(ctx, job)
	}
	if job.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(job, Finalizer) {
		controllerutil.AddFinalizer(job, Finalizer)
		if err := r.client.Update(ctx, job); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer to BuildJob %s/%s: %w", job.Namespace, job.Name, err)
		}
	}
	if !job.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(job, Finalizer) {
		// Deleted without the finalizer (it was removed by hand): nothing is left to do.
		return ctrl.Result{}, nil
	}
	if finished(job) {
		return r.report(ctx, job, outcomeFromStatus(job), true)
	}
	pod, err := r.getPod(ctx, job)
	if err != nil {
		return ctrl.Result{}, err
	}
	o, res, err := r.observe(ctx, job, pod)
	if err != nil || o == nil {
		return res, err
	}
	return r.finish(ctx, job, pod, o)
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

// createPod makes the job's pod, once its environment and token are there.
func (r *Reconciler) createPod(ctx context.Context, job *bkv1.BuildJob) (*outcome, ctrl.Result, error) {
	envName := validation.EnvironmentName(job, r.opts.DefaultBuildEnvironment)
	env, err := r.getEnvironment(ctx, job.Namespace, envName)
	if err != nil {
		return nil, ctrl.Result{}, err
	}
	if env == nil {
		msg := fmt.Sprintf("BuildEnvironment %q does not exist in namespace %q, so the job could not run. Create it, or choose an existing one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).", envName, job.Namespace)
		if envName == "" {
			msg = "The job names no BuildEnvironment and the operator has no default one, so the job could not run. Choose one with the buildkite-operator plugin's build_environment option."
		}
		return neverRan(bkv1.ReasonEnvironmentNotFound, msg, progressZero), ctrl.Result{}, nil
	}
	if !validation.PipelineAllowed(env, job.Spec.PipelineSlug) {
		msg := fmt.Sprintf("Pipeline %q may not use BuildEnvironment %q (its allowedPipelines do not match). Choose another environment, or ask a cluster operator to allow the pipeline.", job.Spec.PipelineSlug, env.Name)
		return neverRan(bkv1.ReasonEnvironmentNotFound, msg, progressZero), ctrl.Result{}, nil
	}
	if _, err := r.token(ctx, job); err != nil {
		if !errors.Is(err, errNoToken) {
			return nil, ctrl.Result{}, err
		}
		// The spawner creates the Secret right after the BuildJob (the Secret is owned by
		// it): wait for it rather than start a pod that cannot read it.
		err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
			st.Phase = bkv1.PhasePending
			st.Message = err.Error()
			setCondition(job, bkv1.ConditionPodCreated, metav1.ConditionFalse, bkv1.ReasonWaitingForTokenSecret, err.Error())
		})
		return nil, ctrl.Result{RequeueAfter: r.opts.JobStatePollInterval}, err
	}
	pod, err := podbuilder.Build(job, env, r.opts.podOptions())
	if err != nil {
		return neverRan(bkv1.ReasonInvalidPod, "The job's pod could not be built: "+err.Error(), progressZero), ctrl.Result{}, nil
	}
	err = r.client.Create(ctx, pod)
	switch {
	case apierrors.IsAlreadyExists(err):
		// Created by an earlier reconcile whose status write was lost: adopt it.
		if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return nil, ctrl.Result{}, fmt.Errorf("getting existing pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if !metav1.IsControlledBy(pod, job) {
			return nil, ctrl.Result{}, fmt.Errorf("pod %s/%s exists but does not belong to BuildJob %s: delete it so the job's own pod can be created", pod.Namespace, pod.Name, job.Name)
		}
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		// A full quota frees up as other jobs end: wait rather than fail the job.
		r.event(job, nil, corev1.EventTypeWarning, "PodQuotaExceeded", "CreatePod", "Waiting for quota: %v", err)
		return nil, ctrl.Result{RequeueAfter: 10 * r.opts.JobStatePollInterval}, nil
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
		return neverRan(bkv1.ReasonPodRejected, "Kubernetes refused to create the job's pod: "+err.Error(), progressZero), ctrl.Result{}, nil
	case err != nil:
		return nil, ctrl.Result{}, fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	default:
		r.event(job, pod, corev1.EventTypeNormal, bkv1.ReasonPodCreated, "CreatePod", "Created pod %s in environment %s", pod.Name, env.Name)
	}
	return nil, ctrl.Result{RequeueAfter: r.opts.JobStatePollInterval}, r.recordPod(ctx, job, pod)
}

// recordPod brings the status up to date with what the pod shows: created, scheduled,
// running.
func (r *Reconciler) recordPod(ctx context.Context, job *bkv1.BuildJob, pod *corev1.Pod) error {
	wasScheduled := job.Status.Phase == bkv1.PhaseScheduled
	wasStarted := conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue)
	running := jobRunning(pod)
	scheduled := pod.Spec.NodeName != "" || condIsTrue(pod, corev1.PodScheduled)
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		st.PodName = pod.Name
		if st.Times.PodCreatedAt == nil {
			t := pod.CreationTimestamp
			st.Times.PodCreatedAt = &t
		}
		setCondition(job, bkv1.ConditionPodCreated, metav1.ConditionTrue, bkv1.ReasonPodCreated, "Pod "+pod.Name+" created")
		switch {
		case running != nil:
			st.Phase = bkv1.PhaseRunning
			st.Message = "The job's command is running."
			if st.Times.StartedAt == nil {
				t := running.StartedAt
				if t.IsZero() {
					t = *r.now()
				}
				st.Times.StartedAt = &t
			}
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionTrue, bkv1.ReasonCommandRunning, "The job's container is running")
		case scheduled:
			st.Phase = bkv1.PhaseScheduled
			st.Message = "The job's pod is on node " + pod.Spec.NodeName + "; waiting for its containers to start."
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionFalse, bkv1.ReasonPodScheduled, "The pod is scheduled; its containers are starting")
		default:
			st.Phase = bkv1.PhasePending
			st.Message = "Waiting for the job's pod to be scheduled."
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionFalse, bkv1.ReasonPodPending, "The pod is waiting to be scheduled")
		}
	})
	if err != nil {
		return err
	}
	if running != nil && !wasStarted {
		podRunningSeconds.Observe(job.Status.Times.StartedAt.Sub(job.CreationTimestamp.Time).Seconds())
		r.event(job, pod, corev1.EventTypeNormal, "Started", "RunCommand", "The job's command started in pod %s", pod.Name)
	} else if scheduled && running == nil && !wasScheduled && !wasStarted {
		r.event(job, pod, corev1.EventTypeNormal, "Scheduled", "SchedulePod", "Pod %s scheduled on node %s", pod.Name, pod.Spec.NodeName)
	}
	return nil
}

// getEnvironment reads the BuildEnvironment from the cache, and from the API server when
// the cache does not have it (it may have been created a moment ago). nil: it does not
// exist.
func (r *Reconciler) getEnvironment(ctx context.Context, namespace, name string) (*bkv1.BuildEnvironment, error) {
	env, err := validation.GetEnvironment(ctx, r.client, namespace, name)
	if err != nil || env != nil || name == "" {
		return env, err
	}
	return validation.GetEnvironment(ctx, r.apiReader, namespace, name)
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
