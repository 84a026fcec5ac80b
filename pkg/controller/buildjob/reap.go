package buildjob

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// reap removes the finalizer of a reported job, deletes its pod after the retention for
// pods and the BuildJob after the retention for BuildJobs.
func (r *Reconciler) reap(ctx context.Context, s *scope) error {
	job := s.job
	pod, err := s.getPod(ctx)
	if err != nil {
		return err
	}
	// The pod is let go of first: once the BuildJob's finalizer is gone, the BuildJob may
	// vanish and no reconcile would come back for the pod.
	if pod != nil {
		if err := r.releasePod(ctx, pod); err != nil {
			return err
		}
		if !job.DeletionTimestamp.IsZero() {
			if err := r.deletePod(ctx, s); err != nil {
				return err
			}
		}
	}
	if controllerutil.ContainsFinalizer(job, Finalizer) {
		controllerutil.RemoveFinalizer(job, Finalizer)
		if err := r.client.Update(ctx, job); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("removing finalizer from BuildJob %s/%s: %w", job.Namespace, job.Name, err)
		}
	}
	if !job.DeletionTimestamp.IsZero() {
		return nil
	}
	return r.reapAfterRetention(ctx, s)
}

// reapAfterRetention deletes the pod of a reported job, and then its BuildJob, once their
// retention (the environment's, or the operator's) has passed since the report, and
// otherwise asks to look again when it will have.
func (r *Reconciler) reapAfterRetention(ctx context.Context, s *scope) error {
	job := s.job
	env, err := s.environment(ctx)
	if err != nil {
		return err
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

	var podLeft time.Duration
	if s.pod != nil {
		if podLeft = reportedAt.Add(podKeep).Sub(s.now); podLeft <= 0 {
			if err := r.deletePod(ctx, s); err != nil {
				return err
			}
		}
	}
	if left := reportedAt.Add(jobKeep).Sub(s.now); left > 0 {
		s.requeueAfter(podLeft, left)
		return nil
	}
	if err := r.deletePod(ctx, s); err != nil {
		return err
	}
	if err := r.client.Delete(ctx, job, client.Preconditions{UID: &job.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting BuildJob %s/%s after its retention: %w", job.Namespace, job.Name, err)
	}
	return nil
}

// deletePod deletes the pod of a reported job, once.
func (r *Reconciler) deletePod(ctx context.Context, s *scope) error {
	pod := s.pod
	if pod == nil || !pod.DeletionTimestamp.IsZero() || s.memory().deleted {
		return nil
	}
	if err := r.releasePod(ctx, pod); err != nil {
		return err
	}
	if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting pod %s/%s of a reported job: %w", pod.Namespace, pod.Name, err)
	}
	s.remember(func(m *jobMemory) { m.deleted = true })
	if r.opts.Handoff != nil {
		r.opts.Handoff.Forget(handoff.RefTo(pod))
	}
	return nil
}

// releasePod removes the operator's finalizer from a pod whose outcome is recorded,
// without dropping one someone else added meanwhile (patchPod).
func (r *Reconciler) releasePod(ctx context.Context, pod *corev1.Pod) error {
	return r.patchPod(ctx, pod, fmt.Sprintf("removing finalizer from pod %s/%s", pod.Namespace, pod.Name), func(pod *corev1.Pod) bool {
		return controllerutil.RemoveFinalizer(pod, podbuilder.PodFinalizer)
	})
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
