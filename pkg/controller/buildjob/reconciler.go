package buildjob

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/requeue"
)

// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildjobs,verbs=get;list;watch;update;delete
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildjobs/status,verbs=update
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildjobs/finalizers,verbs=update
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildenvironments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=pods,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,namespace=buildkite-jobs,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=events,verbs=list

// Reconciler reconciles BuildJobs. Make one with Setup.
type Reconciler struct {
	client    client.Client
	apiReader client.Reader
	recorder  events.EventRecorder
	opts      Options
	// memory is what this process remembers of each BuildJob between its reconciles.
	memory memory
	shared sharedClient
	// startedAt is when this process began to lead, or to reconcile if that came first
	// (started).
	startedAt time.Time
	startOnce sync.Once
}

// reconcile takes a BuildJob one stage further, from the stage its status and its pod show:
//
//	reported   reap: let go of the pod; delete it and the BuildJob after
//	           their retention                                          (reap.go)
//	           or sooner, beyond the cap on reported BuildJobs          (retained.go)
//	otherwise  holdUntilReported: the finalizer keeps the BuildJob until Buildkite is told
//	finished   report: tell Buildkite how the job ended, exactly once   (report.go)
//	no pod     createPod, once the environment and the job token exist  (pod.go)
//	warm pod   that stopped before taking the job: start cold            (warm.go)
//	pod        observe: follow the pod, keeping the status up to date   (observe.go)
//	ended      finish: record the outcome (outcome.go), report, reap    (finish.go)
//
// Each stage takes the reconcile's scope, and asks in it when to look again.
func (r *Reconciler) reconcile(ctx context.Context, s *scope) error {
	if reported(s.job) {
		return r.reap(ctx, s)
	}
	if s.memory().reported == s.job.UID {
		// A copy from before this process recorded the report: wait for the cache.
		s.requeueAfter(staleCopyRetry)
		return nil
	}
	if held, err := r.holdUntilReported(ctx, s); err != nil || !held {
		return err
	}
	if finished(s.job) {
		return r.report(ctx, s, outcomeFromStatus(s.job), true)
	}
	if _, err := s.getPod(ctx); err != nil {
		return err
	}
	if err := r.startColdIfWarmStopped(ctx, s); err != nil {
		return err
	}
	if err := r.reassignWarm(ctx, s); err != nil {
		return err
	}
	o, err := r.observe(ctx, s)
	if err != nil || o == nil {
		return err
	}
	return r.finish(ctx, s, o)
}

// staleCopyRetry is how soon a reconcile handed a BuildJob older than what this process
// wrote looks again: the cache is usually a moment behind.
const staleCopyRetry = 500 * time.Millisecond

// holdUntilReported adds the finalizer that keeps the BuildJob until Buildkite has been told
// how its job ended. false: the BuildJob is being deleted without it (it was removed by
// hand), so nothing is left to do.
func (r *Reconciler) holdUntilReported(ctx context.Context, s *scope) (bool, error) {
	job := s.job
	if !job.DeletionTimestamp.IsZero() {
		return controllerutil.ContainsFinalizer(job, Finalizer), nil
	}
	if !controllerutil.ContainsFinalizer(job, Finalizer) {
		controllerutil.AddFinalizer(job, Finalizer)
		if err := r.client.Update(ctx, job); err != nil {
			return false, fmt.Errorf("adding finalizer to BuildJob %s/%s: %w", job.Namespace, job.Name, err)
		}
	}
	return true, nil
}

// Reconcile converges one BuildJob.
// Reconciles are counted and timed by controller-runtime itself
// (controller_runtime_reconcile_total, controller_runtime_reconcile_time_seconds).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.started()
	job := &bkv1.BuildJob{}
	if err := r.client.Get(ctx, req.NamespacedName, job); err != nil {
		if apierrors.IsNotFound(err) {
			r.memory.forget(req.NamespacedName)
			return ctrl.Result{}, r.releaseOrphan(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	s := r.newScope(job)
	err := r.reconcile(ctx, s)
	s.forgetEvents()
	var bu *buildkiteUnavailable
	switch {
	case errors.As(err, &bu):
		retry := r.retryBuildkite()
		log.FromContext(ctx).Info("Buildkite did not answer; trying the job again later", "call", bu.call, "error", bu.err.Error(), "retryAfter", retry.String())
		return ctrl.Result{RequeueAfter: retry}, nil
	case apierrors.IsConflict(err):
		// Someone (often this controller, a moment ago) changed the object: read it again.
		log.FromContext(ctx).V(1).Info("conflict, retrying", "error", err.Error())
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: s.requeue}, nil
}

// Setup registers the BuildJob controller with mgr. It watches BuildJobs and the pods they
// own.
func Setup(mgr ctrl.Manager, opts Options, setup ...operator.SetupOptions) error {
	opts = opts.withDefaults()
	if opts.Seal == nil {
		return errors.New("the controller needs the operator's seal key (Options.Seal) to tell the spawner's token Secrets from others")
	}
	rec := opts.Recorder
	if rec == nil {
		rec = mgr.GetEventRecorder("buildkite-operator")
	}
	r := &Reconciler{client: GuardTrimmed(mgr.GetClient()), apiReader: mgr.GetAPIReader(), recorder: rec, opts: opts}
	// The classic rate-limited queue: controller-runtime v0.23.1's priority queue can
	// deadlock while the manager stops (a worker in Done waits for the lock its handout
	// loop holds while blocked sending to workers that have already exited), so a restart
	// of the operator would hang until the shutdown grace period ran out.
	noPriorityQueue := false
	copts := controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, UsePriorityQueue: &noPriorityQueue,
		// One wake-up per BuildJob, the latest reconcile's: see package requeue.
		NewQueue: requeue.New[reconcile.Request]}
	operator.ApplySetupOptions(&copts, setup)
	// When this process began to lead (lostPod): a runnable needs leader election unless
	// it says otherwise, so this one runs once the process leads, beside the controller.
	if err := mgr.Add(manager.RunnableFunc(func(context.Context) error { r.started(); return nil })); err != nil {
		return fmt.Errorf("adding the controller's start time: %w", err)
	}
	if err := mgr.Add(manager.RunnableFunc(r.capRetained)); err != nil {
		return fmt.Errorf("adding the cap on reported BuildJobs: %w", err)
	}
	// A BuildJob's own updates bring a reconcile only when its generation changes (its spec,
	// or its deletion): the controller is the only writer of its status, and a reconcile
	// for each of its own status writes was a third of all reconciles, each asking
	// Buildkite about the job. Every reconcile that waits says when to look again.
	return ctrl.NewControllerManagedBy(mgr).
		For(&bkv1.BuildJob{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Pod{}, builder.WithPredicates(r.rememberGone(), podEvents)).
		// The job token Secret (in the cache: ConfigureCache): a BuildJob waits for it.
		Owns(&corev1.Secret{}, builder.WithPredicates(tokenSecretEvents)).
		Named("buildjob").
		WithOptions(copts).
		Complete(r)
}
