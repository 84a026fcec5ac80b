package buildjob

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Event reasons that are not condition reasons.
const (
	EventCanceling = "Canceling"
	EventFailed    = "ReconcileFailed"
)

// event records a Kubernetes event about job, and its pod when there is one.
func (r *Reconciler) event(job *bkv1.BuildJob, pod *corev1.Pod, eventType, reason, action, note string, args ...any) {
	var related runtime.Object
	if pod != nil {
		related = pod
	}
	r.recorder.Eventf(job, related, eventType, reason, action, note, args...)
}
