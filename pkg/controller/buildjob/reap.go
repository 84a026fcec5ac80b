package buildjob

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

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
	if pod == nil || !pod.DeletionTimestamp.IsZero() || r.deleted.has(client.ObjectKeyFromObject(job)) {
		return nil
	}
	if err := r.releasePod(ctx, pod); err != nil {
		return err
	}
	if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting pod %s/%s of a reported job: %w", pod.Namespace, pod.Name, err)
	}
	r.deleted.add(client.ObjectKeyFromObject(job))
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

func duration(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}
