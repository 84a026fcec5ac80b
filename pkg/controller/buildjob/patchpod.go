package buildjob

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// patchPodRetries is how many times patchPod reads a pod again and retries its change
// after a conflict before it gives up.
const patchPodRetries = 5

// patchPod makes change to pod on the API server. change edits the pod it is given and
// returns true, or returns false, leaving it as it is, when there is nothing to do. The
// patch carries the pod's resourceVersion, so it never undoes what someone else wrote
// meanwhile (such as a finalizer they added): on a conflict the pod is read again from the
// API server, as the cache may lag, and change is made again, up to patchPodRetries
// times. A pod that is gone needs nothing. what says what the change is for, in its error.
func (r *Reconciler) patchPod(ctx context.Context, pod *corev1.Pod, what string, change func(*corev1.Pod) bool) error {
	for attempt := 0; ; attempt++ {
		before := pod.DeepCopy()
		if !change(pod) {
			return nil
		}
		err := r.client.Patch(ctx, pod, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err) && attempt < patchPodRetries:
			if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
				return client.IgnoreNotFound(err)
			}
		default:
			return fmt.Errorf("%s: %w", what, err)
		}
	}
}
