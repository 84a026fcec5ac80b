package buildenvironment

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
	"github.com/buildkite-operator/buildkite-operator/pkg/warmdemand"
)

// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=pods,verbs=get;list;watch;create;delete

// WarmPools are what the environment reconciler needs to keep warm pools: the settings of
// the pods it makes, and the registry through which their supervisors get their jobs.
// Without them (nil), no environment has a pool, whatever its spec says.
type WarmPools struct {
	// Pod is how job pods are built; warm pods are built the same way (podbuilder.BuildWarm).
	Pod podbuilder.Options
	// Registry learns of every warm pod, so that its supervisor may wait there for a job.
	Registry *handoff.Registry
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Slots are the operator's slots (the spawner's --slots): the pools of a namespace keep
	// together no more idle pods than the slots that are free to take their jobs
	// (capacity.go). 0: no such cap.
	Slots int
	// Demand sizes the pools that follow demand (spec.warmPool.maxSize) from the jobs
	// waiting on the operator's queue (pkg/warmdemand); nil: every pool is its size.
	Demand warmdemand.Sizer

	mu sync.Mutex
	// kept are the environments whose pools this process has kept once (keep): the
	// registry is ready (Ready) once every environment's pods are registered.
	kept map[types.UID]bool
	// made are the warm pods this process created that the cache may not show yet, by
	// environment: without them a reconcile right after a create would make the pod again.
	made map[types.UID]map[string]time.Time
}

// madeFor is how long a created pod is counted while the cache does not show it.
const madeFor = 30 * time.Second

// unseen forgets the pods of env the cache shows (seen) or that were made too long ago,
// and returns how many made pods it does not show yet.
func (w *WarmPools) unseen(env types.UID, seen map[string]bool, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for name, at := range w.made[env] {
		if seen[name] || now.Sub(at) > madeFor {
			delete(w.made[env], name)
			continue
		}
		n++
	}
	return n
}

func (w *WarmPools) remember(env types.UID, name string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.made == nil {
		w.made = map[types.UID]map[string]time.Time{}
	}
	if w.made[env] == nil {
		w.made[env] = map[string]time.Time{}
	}
	w.made[env][name] = now
}

// warmPodNameMax keeps a warm pod's name a valid hostname: the environment's name, cut,
// then "-warm-" and five random characters.
const warmPodNameMax = 63

// keep makes env's warm pool what its spec asks for, within the operator's capacity
// (capacity.go): warm pods that stopped, were made from an older environment or other
// operator settings, or waited past maxIdle are deleted; idle pods beyond the size, or
// beyond the pool's share of the free slots, are deleted, the newest first; missing ones
// are created, unless a job of the namespace waits for quota. It returns the pool's status
// and when to look again (the next pod to reach maxIdle). Pods assigned to a job belong to
// their BuildJob: they are only counted.
func (w *WarmPools) keep(ctx context.Context, c client.Client, env *bkv1.BuildEnvironment) (*bkv1.WarmPoolStatus, time.Duration, error) {
	pods, err := operator.WarmPods(ctx, c, env)
	if err != nil {
		return nil, 0, err
	}
	w.markKept(env.UID)
	desired, demand := w.desired(env)
	size := int(desired)
	var next time.Duration
	if w.Demand != nil && env.Spec.WarmPool.FollowsDemand() {
		// A pool that follows demand is kept again when the next count may have come.
		next = w.Demand.RecheckAfter()
	}
	if size == 0 && len(pods) == 0 && demand == "" {
		return nil, next, nil
	}
	now := w.now()
	status := &bkv1.WarmPoolStatus{Size: desired}
	idle, seen, soonest, err := w.survey(ctx, c, env, pods, status, now)
	if err != nil {
		return nil, 0, err
	}
	next = operator.Soonest(next, soonest)
	unseen := w.unseen(env.UID, seen, now)
	if unseen > 0 {
		next = operator.Soonest(next, time.Second)
	}
	makeUpTo, keepUpTo, notes, err := w.withinCapacity(ctx, c, env, size)
	if err != nil {
		return nil, 0, err
	}
	if len(notes) > 0 {
		// The watches on BuildJobs bring the reconcile that lifts a cap or a hold; this
		// one is in case an event was missed.
		next = operator.Soonest(next, time.Minute)
	}
	problem, err := w.resize(ctx, c, env, idle, unseen, size, keepUpTo, makeUpTo, status, now)
	if err != nil {
		return nil, 0, err
	}
	if problem != "" {
		notes = append(notes, problem)
		next = operator.Soonest(next, time.Minute)
	}
	if demand != "" {
		notes = append([]string{demand}, notes...)
	}
	status.Message = strings.Join(notes, " ")
	return status, next, nil
}

// survey goes through env's warm pods: it counts the ones assigned to jobs, registers every
// live one, deletes those that must go (retire), and returns the idle ones, the names of all
// it saw, and how long until the first idle one reaches maxIdle.
func (w *WarmPools) survey(ctx context.Context, c client.Client, env *bkv1.BuildEnvironment, pods []corev1.Pod, status *bkv1.WarmPoolStatus, now time.Time) ([]*corev1.Pod, map[string]bool, time.Duration, error) {
	var idle []*corev1.Pod
	var next time.Duration
	seen := map[string]bool{}
	for i := range pods {
		pod := &pods[i]
		seen[pod.Name] = true
		owner := metav1.GetControllerOf(pod)
		switch {
		case owner == nil || owner.UID != env.UID:
			if owner != nil && owner.Kind == "BuildJob" && pod.DeletionTimestamp.IsZero() {
				status.Assigned++
				// A restarted operator's registry learns of it here, so that its supervisor
				// waits for the BuildJob's controller to assign its job again rather than
				// being refused as a stranger.
				w.register(ctx, pod)
			}
			continue
		case !pod.DeletionTimestamp.IsZero():
			continue
		}
		if why := w.retire(env, pod, now); why != "" {
			if err := w.delete(ctx, c, pod, why); err != nil {
				return nil, nil, 0, err
			}
			continue
		}
		w.register(ctx, pod)
		idle = append(idle, pod)
		next = operator.Soonest(next, pod.CreationTimestamp.Add(env.Spec.WarmPool.EffectiveMaxIdle()).Sub(now))
	}
	return idle, seen, next, nil
}

// resize deletes idle pods beyond keepUpTo (counting those made but not yet seen, unseen),
// the newest first, since the oldest are the likeliest to be running already, and creates
// pods up to makeUpTo, counting them in status. It returns what stopped a create, for
// status.warmPool.message, or "".
func (w *WarmPools) resize(ctx context.Context, c client.Client, env *bkv1.BuildEnvironment, idle []*corev1.Pod, unseen, size, keepUpTo, makeUpTo int, status *bkv1.WarmPoolStatus, now time.Time) (string, error) {
	slices.SortFunc(idle, func(a, b *corev1.Pod) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	why := fmt.Sprintf("the pool's size is %d", size)
	if keepUpTo < size {
		why = fmt.Sprintf("the operator's free slots leave the pool %d idle pods", keepUpTo)
	}
	for len(idle) > 0 && len(idle)+unseen > keepUpTo {
		if err := w.delete(ctx, c, idle[len(idle)-1], why); err != nil {
			return "", err
		}
		idle = idle[:len(idle)-1]
	}
	status.Idle = int32(len(idle) + unseen)
	for n := len(idle) + unseen; n < makeUpTo; n++ {
		if err := w.create(ctx, c, env, now); err != nil {
			return fmt.Sprintf("The pool has %d of its %d idle pods: %s", status.Idle, min(size, makeUpTo), err.Error()), nil
		}
		status.Idle++
	}
	return "", nil
}

// desired is env's pool size now, and what it follows or why it keeps its size although
// it has a maxSize (for status.warmPool.message): Demand's answer, or spec.warmPool.size.
func (w *WarmPools) desired(env *bkv1.BuildEnvironment) (int32, string) {
	if w.Demand == nil {
		return env.Spec.WarmPoolSize(), ""
	}
	return w.Demand.Desired(env)
}

// withinCapacity is how many idle pods env's pool of size may have now (see
// capacity.limits): makeUpTo, 0 while a job of the namespace waits for quota; keepUpTo.
// notes say why, when that is fewer than size.
func (w *WarmPools) withinCapacity(ctx context.Context, c client.Reader, env *bkv1.BuildEnvironment, size int) (makeUpTo, keepUpTo int, notes []string, err error) {
	if size == 0 {
		return 0, 0, nil, nil
	}
	cp, err := w.readCapacity(ctx, c, env, size)
	if err != nil {
		return 0, 0, nil, err
	}
	makeUpTo, keepUpTo = cp.limits(env.Name)
	if makeUpTo < size {
		notes = append(notes, cp.capMessage(env.Name, makeUpTo))
	}
	if len(cp.quota) > 0 {
		// The BuildJob controller removes idle warm pods to make room for such a job
		// (buildjob's makeRoomForJob); making others would take the room again.
		makeUpTo = 0
		notes = append(notes, cp.holdMessage(env.Namespace))
	}
	return makeUpTo, keepUpTo, notes, nil
}

// retire says why an unassigned warm pod must go, or "" when it may wait on.
func (w *WarmPools) retire(env *bkv1.BuildEnvironment, pod *corev1.Pod, now time.Time) string {
	switch {
	case podstate.WarmOver(pod):
		return "it stopped before a job came for it"
	case now.Sub(pod.CreationTimestamp.Time) >= env.Spec.WarmPool.EffectiveMaxIdle():
		return fmt.Sprintf("it waited %s for a job (spec.warmPool.maxIdle)", env.Spec.WarmPool.EffectiveMaxIdle())
	}
	return podbuilder.WarmStale(env, w.Pod, pod)
}

// create makes one warm pod of env.
func (w *WarmPools) create(ctx context.Context, c client.Client, env *bkv1.BuildEnvironment, now time.Time) error {
	name := env.Name
	if len(name) > warmPodNameMax-len("-warm-xxxxx") {
		name = strings.TrimRight(name[:warmPodNameMax-len("-warm-xxxxx")], "-.")
	}
	pod, err := podbuilder.BuildWarm(env, w.Pod, name+"-warm-"+rand.String(5))
	if err != nil {
		return fmt.Errorf("a warm pod cannot be built: %w", err)
	}
	if err := c.Create(ctx, pod); err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return fmt.Errorf("the API server refused a warm pod: %w", err)
		}
		return fmt.Errorf("creating warm pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	w.remember(env.UID, pod.Name, now)
	log.FromContext(ctx).V(1).Info("warm pod created", "pod", pod.Name)
	w.register(ctx, pod)
	return nil
}

// delete deletes an idle warm pod, unless it changed meanwhile: a BuildJob may have just
// been assigned it, and its resourceVersion says so.
func (w *WarmPools) delete(ctx context.Context, c client.Client, pod *corev1.Pod, why string) error {
	uid, rv := pod.UID, pod.ResourceVersion
	err := c.Delete(ctx, pod, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case err == nil:
		log.FromContext(ctx).Info("warm pod deleted", "pod", pod.Name, "why", why)
		w.Registry.Forget(handoff.RefTo(pod))
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone already, or changed (assigned): the next reconcile sees which.
	default:
		return fmt.Errorf("deleting warm pod %s/%s (%s): %w", pod.Namespace, pod.Name, why, err)
	}
	return nil
}

func (w *WarmPools) register(ctx context.Context, pod *corev1.Pod) {
	if err := w.Registry.Register(handoff.RefTo(pod)); err != nil {
		log.FromContext(ctx).Error(err, "registering a warm pod", "pod", pod.Name)
	}
}

func (w *WarmPools) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

func (w *WarmPools) markKept(env types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.kept == nil {
		w.kept = map[types.UID]bool{}
	}
	w.kept[env] = true
}

// readyWait bounds how long Ready waits for every environment's first keep.
const readyWait = 30 * time.Second

// Ready is a runnable (leader only, as the controller) that marks the registry ready once
// every BuildEnvironment there is has had its pool kept once, so that every warm pod, idle
// or assigned, is registered: until then the hand-off endpoint tells a pod it does not
// know to come back rather than refusing it, which after an operator restart would end
// pods that are waiting for their jobs. It waits at most readyWait.
func (w *WarmPools) Ready(c cache.Cache) manager.Runnable {
	return manager.RunnableFunc(func(ctx context.Context) error {
		if !c.WaitForCacheSync(ctx) {
			return nil
		}
		deadline := time.Now().Add(readyWait)
		for time.Now().Before(deadline) {
			envs := &bkv1.BuildEnvironmentList{}
			if err := c.List(ctx, envs); err == nil && w.allKept(envs.Items) {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(200 * time.Millisecond):
			}
		}
		w.Registry.MarkReady()
		log.FromContext(ctx).Info("warm pools: every pod registered; the hand-off endpoint now refuses pods it does not know")
		<-ctx.Done()
		return nil
	})
}

func (w *WarmPools) allKept(envs []bkv1.BuildEnvironment) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range envs {
		if !w.kept[e.UID] {
			return false
		}
	}
	return true
}
