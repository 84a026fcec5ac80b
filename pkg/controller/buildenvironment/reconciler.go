// Package buildenvironment is the BuildEnvironment reconciler: it keeps each environment's
// Ready condition true to the checks the webhook runs, and its warm pool (warmpool.go) as
// large as its spec.warmPool asks, within the operator's free slots and the namespace's
// quota (capacity.go).
package buildenvironment

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildenvironments,verbs=get;list;watch
// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildenvironments/status,verbs=update

// maxConditionMessage is the longest message the API server takes in a condition.
const maxConditionMessage = 32768

// EnvironmentReconciler keeps each BuildEnvironment's Ready condition: the verdict of the
// checks the webhook runs (validation.BuildEnvironment). An environment that predates the
// webhook, or was admitted while it was off, so shows as not ready, with what is wrong;
// jobs cannot run in it either way (intake and the pod builder check it again).
type EnvironmentReconciler struct {
	client client.Client
	// warm keeps the environments' warm pools; nil when the operator has no hand-off
	// endpoint, and then no environment has a pool.
	warm *WarmPools
}

// Reconcile sets one BuildEnvironment's Ready condition and observedGeneration.
func (r *EnvironmentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	env := &bkv1.BuildEnvironment{}
	if err := r.client.Get(ctx, req.NamespacedName, env); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted: its pool's metrics go with it (its pods go with their owner).
			operator.ForgetWarmPool(req.Namespace, req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := env.Status.DeepCopy()
	meta.SetStatusCondition(&env.Status.Conditions, readyCondition(env))
	env.Status.ObservedGeneration = env.Generation
	var res ctrl.Result
	if r.warm != nil {
		pool, next, err := r.warm.keep(ctx, r.client, env)
		if err != nil {
			return ctrl.Result{}, err
		}
		env.Status.WarmPool, res.RequeueAfter = pool, next
		operator.RecordWarmPool(env, pool)
	}
	if equality.Semantic.DeepEqual(before, &env.Status) {
		return res, nil
	}
	err := r.client.Status().Update(ctx, env)
	switch {
	case apierrors.IsConflict(err):
		// The environment changed since it was read: the next reconcile sees it.
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("updating status of BuildEnvironment %s/%s: %w", env.Namespace, env.Name, err)
	}
	return res, nil
}

// readyCondition is env's Ready condition, from the validation the webhook runs.
func readyCondition(env *bkv1.BuildEnvironment) metav1.Condition {
	c := metav1.Condition{Type: bkv1.ConditionReady, ObservedGeneration: env.Generation}
	errs, _ := validation.BuildEnvironment(env)
	if len(errs) == 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, bkv1.ReasonEnvironmentValid, "Jobs can run in this environment."
		return c
	}
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = e.Error()
	}
	c.Status, c.Reason = metav1.ConditionFalse, bkv1.ReasonEnvironmentInvalid
	c.Message = fmt.Sprintf("%d problems: %s", len(errs), strings.Join(lines, ". "))
	if len(errs) == 1 {
		c.Message = "1 problem: " + lines[0]
	}
	if len(c.Message) > maxConditionMessage {
		c.Message = c.Message[:maxConditionMessage-3] + "..."
	}
	return c
}

// Setup registers the BuildEnvironment controller with mgr. With warm, it keeps the
// environments' warm pools too, and watches their pods and the BuildJobs whose slots and
// quota waits the pools make way for (capacity.go).
func Setup(mgr ctrl.Manager, warm *WarmPools, setup ...operator.SetupOptions) error {
	copts := ctrlcontroller.Options{}
	operator.ApplySetupOptions(&copts, setup)
	b := ctrl.NewControllerManagedBy(mgr).
		For(&bkv1.BuildEnvironment{}).
		Named("buildenvironment").
		WithOptions(copts)
	if warm != nil {
		// A warm pod's events bring its environment's reconcile: its owner while it waits,
		// and, when a BuildJob is assigned it, its owner before (the update's old object).
		b = b.Owns(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetLabels()[podbuilder.LabelWarmPool] != ""
		})))
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &bkv1.BuildJob{}, indexUnreported, indexBuildJob); err != nil {
			return fmt.Errorf("indexing the BuildJobs in flight for the warm pools: %w", err)
		}
		b = b.Watches(&bkv1.BuildJob{}, handler.EnqueueRequestsFromMapFunc(pooledEnvironments(mgr.GetClient())),
			builder.WithPredicates(capacityEvents))
	}
	return b.Complete(&EnvironmentReconciler{client: mgr.GetClient(), warm: warm})
}
