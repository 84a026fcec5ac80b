package buildjob

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// Events of a job's start in a warm pod, or cold beside a warm pool.
const (
	EventWarmPodAssigned = "WarmPodAssigned"
	EventStartedCold     = "StartedCold"
)

// takeWarmPod gives the job an idle warm pod of its environment that fits it
// (podbuilder.WarmFits), instead of a pod of its own: the pod is made the job's (its
// labels, owner, finalizer and deadline: podbuilder.AssignWarm, one patch that fails if
// the pod changed since it was read, so two jobs never take one pod) and the registry is
// given the job for the pod's supervisor to fetch. It reports whether the job has its pod.
// A job that no warm pod fits starts cold, and an event says why.
func (r *Reconciler) takeWarmPod(ctx context.Context, s *scope, env *bkv1.BuildEnvironment) (bool, error) {
	job := s.job
	if r.opts.Handoff == nil || env.Spec.WarmPoolSize() == 0 || bkv1.MadeByHand(job) {
		return false, nil
	}
	candidates, err := r.idleWarmPods(ctx, env)
	if err != nil || len(candidates) == 0 {
		return false, err
	}
	opts := r.opts.podOptions()
	var why string
	for _, warm := range candidates {
		ok, w := podbuilder.WarmFits(job, env, opts, warm)
		if !ok {
			why = w
			continue
		}
		taken, err := r.assignWarm(ctx, s, env, warm)
		if err != nil || taken {
			return taken, err
		}
	}
	if why != "" {
		r.event(job, nil, corev1.EventTypeNormal, EventStartedCold, "CreatePod", "No warm pod of BuildEnvironment %s fits the job, so it starts in a pod of its own: %s", env.Name, why)
	}
	return false, nil
}

// idleWarmPods are env's warm pods that wait for a job, those already running first, then
// the oldest (they are the first to be replaced).
func (r *Reconciler) idleWarmPods(ctx context.Context, env *bkv1.BuildEnvironment) ([]*corev1.Pod, error) {
	pods, err := operator.WarmPods(ctx, r.client, env)
	if err != nil {
		return nil, err
	}
	var idle []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		owner := metav1.GetControllerOf(p)
		if owner == nil || owner.UID != env.UID || !p.DeletionTimestamp.IsZero() || podstate.WarmOver(p) {
			continue
		}
		idle = append(idle, p)
	}
	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }
	slices.SortStableFunc(idle, func(a, b *corev1.Pod) int {
		if ra, rb := running(a), running(b); ra != rb {
			if ra {
				return -1
			}
			return 1
		}
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return idle, nil
}

// assignWarm makes warm the job's pod and gives the registry the job for it. false
// without an error: another job took the pod first, or it went away.
func (r *Reconciler) assignWarm(ctx context.Context, s *scope, env *bkv1.BuildEnvironment, warm *corev1.Pod) (bool, error) {
	job := s.job
	hj, err := r.handoffJob(ctx, s, env)
	if err != nil {
		return false, err
	}
	pod := warm.DeepCopy()
	patch := client.MergeFromWithOptions(warm, client.MergeFromWithOptimisticLock{})
	if err := podbuilder.AssignWarm(pod, job, env, r.opts.podOptions(), s.now); err != nil {
		return false, fmt.Errorf("assigning warm pod %s/%s to BuildJob %s: %w", pod.Namespace, pod.Name, job.Name, err)
	}
	err = r.client.Patch(ctx, pod, patch)
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("assigning warm pod %s/%s to BuildJob %s: %w", pod.Namespace, pod.Name, job.Name, err)
	}
	if err := r.opts.Handoff.Assign(handoff.RefTo(pod), hj); err != nil {
		return false, fmt.Errorf("handing job %s to warm pod %s/%s: %w", job.Spec.JobID, pod.Namespace, pod.Name, err)
	}
	s.pod, s.podRead = pod, true
	s.remember(func(m *jobMemory) { m.created, m.warmPod = true, pod.Name })
	r.event(job, pod, corev1.EventTypeNormal, EventWarmPodAssigned, "CreatePod", "The job starts in warm pod %s of BuildEnvironment %s", pod.Name, env.Name)
	s.requeueAfter(r.opts.JobStatePollInterval)
	return true, nil
}

// handoffJob is what the job's warm pod fetches: the job's env as its own pod's job
// container would have it, with the values the kubelet would read from the token Secret.
func (r *Reconciler) handoffJob(ctx context.Context, s *scope, env *bkv1.BuildEnvironment) (handoffclient.Job, error) {
	job := s.job
	sec := &corev1.Secret{}
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Spec.TokenSecretRef.Name}
	// From the API server: the cache keeps only the token of a token Secret, not the
	// job's env the Secret holds beside it.
	if err := r.apiReader.Get(ctx, key, sec); err != nil {
		return handoffclient.Job{}, fmt.Errorf("reading token Secret %s for the job's hand-off: %w", key, err)
	}
	vars, err := podbuilder.HandoffEnv(job, env, r.opts.podOptions(), sec)
	if err != nil {
		return handoffclient.Job{}, fmt.Errorf("the job's env for its hand-off: %w", err)
	}
	// The token goes in the hand-off's own field, which the supervisor puts where the job's
	// pod would have had it.
	token := vars[podcontract.EnvAccessToken]
	delete(vars, podcontract.EnvAccessToken)
	return handoffclient.Job{ID: job.Spec.JobID, BuildJob: job.Name, Command: job.Spec.Command, Env: vars, Token: token}, nil
}

// warmPodName finds the warm pod assigned to the job when its status does not name it yet:
// this process remembers it, or (after a restart) it carries the job's label.
func (s *scope) warmPodName(ctx context.Context) (string, error) {
	if name := s.memory().warmPod; name != "" {
		return name, nil
	}
	if s.r.opts.Handoff == nil {
		return "", nil
	}
	pods := &corev1.PodList{}
	if err := s.r.client.List(ctx, pods, client.InNamespace(s.job.Namespace),
		client.MatchingLabels{podbuilder.LabelBuildJob: validation.LabelValue(s.job.Name)}); err != nil {
		return "", fmt.Errorf("listing the pods of BuildJob %s/%s: %w", s.job.Namespace, s.job.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Labels[podbuilder.LabelWarmPool] != "" && metav1.IsControlledBy(p, s.job) {
			return p.Name, nil
		}
	}
	return "", nil
}

// reassignWarm gives the registry the job of the warm pod assigned to it, when it does
// not have it: the operator restarted between the assignment and the pod's fetch. A pod
// that already fetched its job has no use for it; a new process cannot tell, so the job
// is offered again, to that pod alone.
func (r *Reconciler) reassignWarm(ctx context.Context, s *scope) error {
	pod := s.pod
	if r.opts.Handoff == nil || pod == nil || pod.Labels[podbuilder.LabelWarmPool] == "" || podstate.Stopped(pod) {
		return nil
	}
	if st := r.opts.Handoff.State(handoff.RefTo(pod)); st == handoff.StateAssigned || st == handoff.StateHandedOff {
		return nil
	}
	env, err := s.environment(ctx)
	if err != nil || env == nil {
		return err
	}
	hj, err := r.handoffJob(ctx, s, env)
	if err != nil {
		return err
	}
	if err := r.opts.Handoff.Assign(handoff.RefTo(pod), hj); err != nil {
		return fmt.Errorf("handing job %s to warm pod %s/%s again: %w", s.job.Spec.JobID, pod.Namespace, pod.Name, err)
	}
	return nil
}
