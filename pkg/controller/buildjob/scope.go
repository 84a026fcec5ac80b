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

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// scope is one reconcile of one BuildJob. Reconcile makes it and every stage takes it, so
// that what a reconcile reads is read once, however many stages need it: the pod, the
// environment, the pod's events (only when a check needs them), the Buildkite client (only
// when a call needs it). Its clock is read once, so every decision of the reconcile is
// made at the same instant, and it gathers when the reconcile asks to look again.
type scope struct {
	r   *Reconciler
	job *bkv1.BuildJob
	key types.NamespacedName
	// now is the reconcile's instant (Options.Now), until the report moves it on
	// (reportTime).
	now time.Time
	// buildkiteDeadline is when the reconcile's Buildkite calls must be done by, retries
	// included: a slow Buildkite holds this worker briefly, and the other BuildJobs are
	// not kept waiting behind it. It is the real clock's, not Options.Now's, as the
	// calls' own deadlines are.
	buildkiteDeadline time.Time

	pod     *corev1.Pod // nil: the job has none (getPod)
	podRead bool

	env     *bkv1.BuildEnvironment // nil: it does not exist (environment)
	envRead bool

	events     []corev1.Event
	eventsRead bool

	bk     *agentapi.Client
	bkErr  error // wraps errNoToken when there is no token to use
	bkRead bool

	// requeue is when the reconcile asks to look again; 0 for never.
	requeue time.Duration
}

func (r *Reconciler) newScope(job *bkv1.BuildJob) *scope {
	return &scope{
		r: r, job: job, key: client.ObjectKeyFromObject(job), now: r.opts.Now(),
		buildkiteDeadline: time.Now().Add(r.opts.BuildkiteTimeout),
	}
}

// requeueAfter asks to look again after each d that is positive, the soonest of all the
// reconcile asks for: the one place where its requeues meet.
func (s *scope) requeueAfter(d ...time.Duration) {
	s.requeue = operator.Soonest(append(d, s.requeue)...)
}

// getPod returns the job's pod, or nil when it does not exist, read once per reconcile. A
// pod the cache has not seen yet is looked up in the API server before it is taken for
// gone, so a cache that lags behind a create never makes the controller think the pod
// was deleted; one this process deleted (reap) is gone when the cache says so.
func (s *scope) getPod(ctx context.Context) (*corev1.Pod, error) {
	if s.podRead {
		return s.pod, nil
	}
	job := s.job
	name := job.Status.PodName
	if name != "" && name == s.memory().withdrawn.Name {
		// A cached status from before startColdIfWarmStopped let go of the warm pod, which
		// is no longer the job's: the job's pod is its own now, cold.
		name = ""
	}
	if name == "" {
		name = podbuilder.PodName(job)
		warm, err := s.warmPodName(ctx)
		if err != nil {
			return nil, err
		}
		if warm != "" {
			name = warm
		}
	}
	key := types.NamespacedName{Namespace: job.Namespace, Name: name}
	pod := &corev1.Pod{}
	err := s.r.client.Get(ctx, key, pod)
	if apierrors.IsNotFound(err) && s.podMade() && !s.memory().deleted {
		err = s.r.apiReader.Get(ctx, key, pod)
	}
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return nil, fmt.Errorf("getting pod %s: %w", key, err)
	case !metav1.IsControlledBy(pod, job):
		return nil, fmt.Errorf("pod %s exists but does not belong to BuildJob %s (uid %s): delete it so the job's own pod can be created", key, job.Name, job.UID)
	}
	s.pod, s.podRead = pod, true
	return pod, nil
}

// podMade: the job's pod was created, as its status says, or as this process knows from
// its own create before a status write records it (recordPod).
func (s *scope) podMade() bool {
	return conditionIs(s.job, bkv1.ConditionPodCreated, metav1.ConditionTrue) || s.memory().created
}

// envName is the name of the job's BuildEnvironment.
func (s *scope) envName() string {
	return validation.EnvironmentName(s.job, s.r.opts.DefaultBuildEnvironment)
}

// environment is the job's BuildEnvironment, nil when it does not exist, read once per
// reconcile: from the cache, and from the API server when the cache does not have it
// (it may have been created a moment ago).
func (s *scope) environment(ctx context.Context) (*bkv1.BuildEnvironment, error) {
	if !s.envRead {
		reader := validation.CacheFirst{Cache: s.r.client, API: s.r.apiReader}
		env, err := validation.GetEnvironment(ctx, reader, s.job.Namespace, s.envName())
		if err != nil {
			return nil, err
		}
		s.env, s.envRead = env, true
	}
	return s.env, nil
}

// podEvents lists the events about the job's pod, at most once per reconcile, and once
// per JobStatePollInterval over reconciles in a row that read them (jobMemory.events): a
// pending pod's state changes each bring a reconcile, and its events only time a wait's
// bound, which is minutes. Events are read from the API server when a check needs them
// (eventsOfSlowPod), not cached.
func (s *scope) podEvents(ctx context.Context) ([]corev1.Event, error) {
	if s.eventsRead {
		return s.events, nil
	}
	pod := s.pod
	if m := s.memory().events; m != nil && m.pod == pod.UID && s.now.Sub(m.at) < s.r.opts.JobStatePollInterval {
		s.events, s.eventsRead = m.items, true
		return s.events, nil
	}
	var list corev1.EventList
	if err := s.r.apiReader.List(ctx, &list, client.InNamespace(pod.Namespace), client.MatchingFields{"involvedObject.uid": string(pod.UID)}); err != nil {
		return nil, fmt.Errorf("listing the events of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	s.events, s.eventsRead = list.Items, true
	s.remember(func(m *jobMemory) { m.events = &eventsMemo{pod: pod.UID, at: s.now, items: list.Items} })
	return s.events, nil
}

// forgetEvents drops the pod's events kept from an earlier reconcile once a reconcile does
// not read them (its pod runs, or has ended): they are kept only while they are used.
func (s *scope) forgetEvents() {
	if !s.eventsRead && s.memory().events != nil {
		s.remember(func(m *jobMemory) { m.events = nil })
	}
}

// buildkite is a Buildkite client with the job's token, made the first time a call of
// the reconcile needs it; an error that wraps errNoToken when there is no token to use
// (see token). The client is remembered for the job's next reconciles (jobMemory.client).
func (s *scope) buildkite(ctx context.Context) (*agentapi.Client, error) {
	if !s.bkRead {
		s.bk, s.bkErr = s.r.agentClient(ctx, s)
		s.bkRead = true
	}
	return s.bk, s.bkErr
}

// buildkiteContext is the context for one Buildkite call: ctx, ending with the
// reconcile's Buildkite budget. The Kubernetes calls of the reconcile keep ctx itself.
func (s *scope) buildkiteContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, s.buildkiteDeadline)
}

// reportTime is when Buildkite was told how the job ended, for status.times.reportedAt.
// The clock moves on to it: the report's time includes this reconcile's calls to Buildkite
// (the finish latency measures them), and reap measures the retention from it.
func (s *scope) reportTime() *metav1.Time {
	s.now = s.r.opts.Now()
	t := metav1.NewTime(s.now)
	return &t
}

// nowTime is the reconcile's instant, for the status.
func (s *scope) nowTime() *metav1.Time {
	t := metav1.NewTime(s.now)
	return &t
}

// memory is what this process remembers of the job (jobMemory).
func (s *scope) memory() jobMemory { return s.r.memory.get(s.key) }

// remember changes what this process remembers of the job.
func (s *scope) remember(change func(*jobMemory)) { s.r.memory.update(s.key, change) }
