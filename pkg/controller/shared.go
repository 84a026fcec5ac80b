package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
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
