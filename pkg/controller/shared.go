package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// Soonest is the shortest positive duration of ds, 0 when none is: the one wait a
// reconcile asks for when it has several reasons to look again.
func Soonest(ds ...time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		if d > 0 && (m == 0 || d < m) {
			m = d
		}
	}
	return m
}

// WarmPods lists env's warm pods (podbuilder.LabelWarmPool), idle or assigned, from r:
// the BuildEnvironment reconciler keeps them, the BuildJob reconciler takes them.
func WarmPods(ctx context.Context, r client.Reader, env *bkv1.BuildEnvironment) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(env.Namespace),
		client.MatchingLabels{podbuilder.LabelWarmPool: validation.LabelValue(env.Name)}); err != nil {
		return nil, fmt.Errorf("listing the warm pods of BuildEnvironment %s/%s: %w", env.Namespace, env.Name, err)
	}
	return pods.Items, nil
}

// WaitsForQuota reports whether a ResourceQuota refuses the job's pod and the job waits for
// room (the BuildJob reconciler's waitForQuota: PodCreated False, WaitingForQuota), neither
// ended nor given a pod since. The BuildJob reconciler makes room for it by deleting idle
// warm pods, and the BuildEnvironment reconciler makes none while it waits.
func WaitsForQuota(job *bkv1.BuildJob) bool {
	if job.Status.Times.ReportedAt != nil || meta.IsStatusConditionTrue(job.Status.Conditions, bkv1.ConditionFinished) {
		return false
	}
	c := meta.FindStatusCondition(job.Status.Conditions, bkv1.ConditionPodCreated)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == bkv1.ReasonWaitingForQuota
}
