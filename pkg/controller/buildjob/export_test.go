package buildjob

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// NewReconcilerForTest is a Reconciler on c without a manager, for tests that run one stage
// directly with the BuildJob they choose, such as the stale copy a lagging cache hands a
// reconcile.
func NewReconcilerForTest(c client.Client, opts Options) *Reconciler {
	return &Reconciler{client: c, apiReader: c, recorder: &events.FakeRecorder{}, opts: opts.withDefaults()}
}

// ShowWaitForTest is showWait with a warning notice of reason and text.
func (r *Reconciler) ShowWaitForTest(ctx context.Context, job *bkv1.BuildJob, reason, text string) error {
	return r.showWait(ctx, r.newScope(job), &waitNotice{reason: reason, style: "warning", text: text})
}

// PatchPodForTest is patchPod.
func (r *Reconciler) PatchPodForTest(ctx context.Context, pod *corev1.Pod, what string, change func(*corev1.Pod) bool) error {
	return r.patchPod(ctx, pod, what, change)
}
