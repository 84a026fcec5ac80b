package soak

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// soakEnvironment is the BuildEnvironment the soak's jobs run in: the operator's default.
const soakEnvironment = "default"

// keepWarmPool gives the soak's environment a warm pool of size, so that jobs start in warm
// pods through the hand-off while everything fails around them, and waits until it is full.
func (s *soak) keepWarmPool(ctx context.Context, size int32) error {
	key := client.ObjectKey{Namespace: s.env.JobNamespace, Name: soakEnvironment}
	var last error
	// The update goes through the operator's validating webhook, which may not serve yet
	// (its certificate is minted after a start): try again until it does.
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var be bkv1.BuildEnvironment
			if err := s.env.Client.Get(ctx, key, &be); err != nil {
				return err
			}
			be.Spec.WarmPool = &bkv1.WarmPool{Size: size}
			return s.env.Client.Update(ctx, &be)
		})
		return last == nil, nil
	}); err != nil {
		return fmt.Errorf("giving BuildEnvironment %s a warm pool of %d: %w (last: %v)", soakEnvironment, size, err, last)
	}
	t0 := time.Now()
	for {
		idle, err := s.idleWarmPods(ctx)
		if err != nil {
			return err
		}
		if len(idle) >= int(size) {
			s.cfg.Logf("warm pool of %d running after %s", size, time.Since(t0).Round(10*time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the warm pool never filled (%d of %d idle pods): %w", len(idle), size, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// idleWarmPods are the pool's running pods that no job has taken, by name.
func (s *soak) idleWarmPods(ctx context.Context) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := s.env.Client.List(ctx, &pods, client.InNamespace(s.env.JobNamespace),
		client.MatchingLabels{podbuilder.LabelWarmPool: soakEnvironment}); err != nil {
		return nil, fmt.Errorf("listing warm pods: %w", err)
	}
	var idle []corev1.Pod
	for _, p := range pods.Items {
		if _, taken := p.Labels[bkv1.LabelJob]; !taken && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			idle = append(idle, p)
		}
	}
	sort.Slice(idle, func(a, b int) bool { return idle[a].Name < idle[b].Name })
	return idle, nil
}

// deleteWarmPod deletes an idle warm pod, chosen at random: no job is in it, so none may
// suffer. The delete is conditional on the pod as it was seen: one that a job took in
// between (a change to its labels) is left alone, since deleting it would disturb that job.
func (s *soak) deleteWarmPod(ctx context.Context) {
	idle, err := s.idleWarmPods(ctx)
	if err != nil {
		s.cfg.Logf("%v", err)
		return
	}
	if len(idle) == 0 {
		return
	}
	s.mu.Lock()
	p := idle[s.rng.IntN(len(idle))]
	s.mu.Unlock()
	err = s.env.Client.Delete(ctx, &p, client.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion})
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return
	case err != nil:
		s.cfg.Logf("deleting warm pod %s: %v", p.Name, err)
		return
	}
	s.count(FaultWarmPodDeleted)
}

// countWarmStarts counts the jobs that ran in a warm pod: their BuildJob's pod is one the
// pool made (the keeper names them <environment>-warm-<suffix>).
func (s *soak) countWarmStarts(ctx context.Context, ids []string) error {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var list bkv1.BuildJobList
	if err := s.env.Client.List(ctx, &list, client.InNamespace(s.env.JobNamespace)); err != nil {
		return fmt.Errorf("listing BuildJobs: %w", err)
	}
	for _, bj := range list.Items {
		if want[bj.Spec.JobID] && strings.HasPrefix(bj.Status.PodName, soakEnvironment+"-warm-") {
			s.res.WarmStarts++
		}
	}
	return nil
}
