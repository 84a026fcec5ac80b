package buildjob

import (
	"context"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// EventWarmPodRemoved says which idle warm pod was deleted to make room for the job's pod,
// which a ResourceQuota refused (makeRoomForJob).
const EventWarmPodRemoved = "WarmPodRemoved"

// makeRoomForJob deletes one idle warm pod of the job's namespace, of any environment,
// when a ResourceQuota refused the job's pod (waitForQuota): warm pods never take room a
// job needs. The pool does not make it again while the job waits (the BuildEnvironment
// reconciler's capacity.go), so the room goes to the job once the quota's usage is
// counted again. A pod that changed since the cache showed it (a job was just assigned
// it) is not deleted (a precondition on its resourceVersion); the next one is tried.
// Those not yet running go first, then the newest: the opposite of the order jobs take
// them in (idleWarmPods), so the two rarely meet. Each refusal deletes one pod: a job
// that needs the room of several gets it over its retries.
//
// Writes, on the quota path only: one pod Delete (one more for each pod that changed
// meanwhile) and one event on the BuildJob per refusal while the namespace has an idle
// warm pod; none once it has none. A failure is logged, and the job waits on.
func (r *Reconciler) makeRoomForJob(ctx context.Context, s *scope) {
	if r.opts.Handoff == nil {
		return
	}
	job := s.job
	if !r.cacheShowsQuotaWait(ctx, job) {
		return
	}
	pods := &corev1.PodList{}
	if err := r.client.List(ctx, pods, client.InNamespace(job.Namespace), client.HasLabels{podbuilder.LabelWarmPool}); err != nil {
		log.FromContext(ctx).Error(err, "listing the warm pods that could make room for the job's pod")
		return
	}
	var idle []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		owner := metav1.GetControllerOf(p)
		// A pod that ended takes no quota any more; its pool's keeper deletes it.
		if owner == nil || owner.Kind != "BuildEnvironment" || !p.DeletionTimestamp.IsZero() ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		idle = append(idle, p)
	}
	sortWarmForJobs(idle)
	slices.Reverse(idle)
	for _, p := range idle {
		uid, rv := p.UID, p.ResourceVersion
		err := r.client.Delete(ctx, p, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			continue // assigned, changed or gone meanwhile
		case err != nil:
			log.FromContext(ctx).Error(err, "deleting an idle warm pod to make room for the job's pod", "pod", p.Name)
			return
		}
		r.opts.Handoff.Forget(handoff.RefTo(p))
		r.event(job, p, corev1.EventTypeNormal, EventWarmPodRemoved, "CreatePod",
			"Deleted idle warm pod %s of BuildEnvironment %s to make room for the job's pod, which a ResourceQuota of namespace %s refused; warm pods give way to jobs, and the pools make no new ones while the job waits",
			p.Name, metav1.GetControllerOf(p).Name, job.Namespace)
		return
	}
}

// quotaWaitSeen bounds how long makeRoomForJob waits for the cache to show the job's wait
// for quota, which the status write before it recorded.
const quotaWaitSeen = 2 * time.Second

// cacheShowsQuotaWait waits until the cache shows that the job waits for quota, as its
// status now says: agentd's warm pools read the same cache, and one that heard of the
// deleted pod before the wait would make the pod again, taking back the room. Only the
// first refusal of a wait waits here, for a moment. false when the cache does not show it
// in time (the job's next refusal makes room then) or ctx ends.
func (r *Reconciler) cacheShowsQuotaWait(ctx context.Context, job *bkv1.BuildJob) bool {
	if !operator.WaitsForQuota(job) {
		return false // the status does not record the wait: nothing tells the pools to hold
	}
	cached := &bkv1.BuildJob{}
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, quotaWaitSeen, true, func(ctx context.Context) (bool, error) {
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(job), cached); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return operator.WaitsForQuota(cached), nil
	})
	return err == nil
}
