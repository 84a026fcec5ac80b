package buildenvironment

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
)

// Warm pods and the operator's capacity. An idle warm pod is of use only to a slot that is
// free to take a job for it, and it holds what a cold job's pod needs (node resources, the
// namespace's quota), so the pools of a namespace keep together no more idle pods than
// the operator has free slots, and make none while a job of the namespace waits for quota
// (the BuildJob controller removes idle warm pods to make room for such a job).

// +kubebuilder:rbac:groups=buildkite-operator.dev,namespace=buildkite-jobs,resources=buildjobs,verbs=get;list;watch

// indexUnreported indexes the cached BuildJobs that are not yet reported (valueUnreported):
// only those can hold a slot or wait for quota, and they are a handful beside the
// reported ones kept for their retention (an hour of jobs).
const (
	indexUnreported = "buildkite-operator.dev/unreported"
	valueUnreported = "true"
)

func indexBuildJob(o client.Object) []string {
	if job, ok := o.(*bkv1.BuildJob); ok && job.Status.Times.ReportedAt == nil {
		return []string{valueUnreported}
	}
	return nil
}

// holdsSlot: one of the operator's slots is busy with the job. A slot accepts a job and
// the spawner makes its BuildJob (one a person made by hand holds no slot); the slot stays
// busy until the BuildJob is reported (status.times.reportedAt) or deleted: see the
// spawner's waitReported.
func holdsSlot(job *bkv1.BuildJob) bool {
	return job.Status.Times.ReportedAt == nil && !bkv1.MadeByHand(job)
}

// startDecided: how the job starts is settled. Its status records its pod (warm or its
// own), or what its pod waits for (PodCreated False), or how it ended. Until then the job
// may be about to take one of the idle warm pods.
func startDecided(job *bkv1.BuildJob) bool {
	return job.Status.PodName != "" || meta.FindStatusCondition(job.Status.Conditions, bkv1.ConditionPodCreated) != nil ||
		meta.IsStatusConditionTrue(job.Status.Conditions, bkv1.ConditionFinished)
}

// capacityEvents lets through the BuildJob events that change what the pools of its
// namespace may keep: a slot freed (the job reported, or its BuildJob deleted before),
// which lets the pools refill; a job's start decided (its pod recorded, warm or cold, or
// its wait), from which on it counts fully against the free slots (fewer idle pods kept);
// and a wait for quota over, which lets the pools make pods again. That is at most three
// events a job; the rest of a job's life (its status refining a phase, its own pod's
// events) is left out, and so is its creation: a new job counts against the free slots
// at the next reconcile, and its start's event comes soon after.
var capacityEvents = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*bkv1.BuildJob)
		job, ok := e.ObjectNew.(*bkv1.BuildJob)
		if !oldOK || !ok {
			return false
		}
		return (holdsSlot(old) && !holdsSlot(job)) ||
			(operator.WaitsForQuota(old) && !operator.WaitsForQuota(job)) ||
			(holdsSlot(job) && !startDecided(old) && startDecided(job))
	},
	DeleteFunc: func(e event.DeleteEvent) bool {
		job, ok := e.Object.(*bkv1.BuildJob)
		return ok && (holdsSlot(job) || operator.WaitsForQuota(job))
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// pooledEnvironments maps a BuildJob's event to the environments of its namespace that
// keep a pool: they share the namespace's free slots and its quota.
func pooledEnvironments(c client.Reader) func(context.Context, client.Object) []reconcile.Request {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		envs := &bkv1.BuildEnvironmentList{}
		if err := c.List(ctx, envs, client.InNamespace(o.GetNamespace())); err != nil {
			return nil
		}
		var out []reconcile.Request
		for i := range envs.Items {
			if e := &envs.Items[i]; e.Spec.HasWarmPool() {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: e.Namespace, Name: e.Name}})
			}
		}
		return out
	}
}

// capacity is what the pools of one namespace may spend, read from the cache.
type capacity struct {
	// slots are the operator's (WarmPools.Slots); 0: no cap.
	slots int
	// holding are the jobs that hold a slot (holdsSlot); decided are those of them whose
	// start is decided (startDecided).
	holding, decided int
	// quota names the BuildJobs that wait for quota (operator.WaitsForQuota), sorted.
	quota []string
	// sizes are the sizes of the namespace's pools, by environment name.
	sizes map[string]int
}

// readCapacity reads what the pools of env's namespace may spend; env's own size is
// size, whatever the cache shows of it.
func (w *WarmPools) readCapacity(ctx context.Context, c client.Reader, env *bkv1.BuildEnvironment, size int) (*capacity, error) {
	jobs := &bkv1.BuildJobList{}
	// Only the unreported ones, by index, and without copies: nothing here writes them.
	if err := c.List(ctx, jobs, client.InNamespace(env.Namespace), client.MatchingFields{indexUnreported: valueUnreported},
		client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the BuildJobs in flight in namespace %s: %w", env.Namespace, err)
	}
	cp := &capacity{slots: w.Slots, sizes: map[string]int{env.Name: size}}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if holdsSlot(job) {
			cp.holding++
			if startDecided(job) {
				cp.decided++
			}
		}
		if operator.WaitsForQuota(job) {
			cp.quota = append(cp.quota, job.Name)
		}
	}
	slices.Sort(cp.quota)
	if cp.slots <= 0 {
		return cp, nil
	}
	envs := &bkv1.BuildEnvironmentList{}
	if err := c.List(ctx, envs, client.InNamespace(env.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the BuildEnvironments of namespace %s: %w", env.Namespace, err)
	}
	for i := range envs.Items {
		e := &envs.Items[i]
		if s, _ := w.desired(e); s > 0 && e.Name != env.Name && e.DeletionTimestamp.IsZero() {
			cp.sizes[e.Name] = int(s)
		}
	}
	return cp, nil
}

// limits are how many idle pods the pool of the environment name may have. makeUpTo, the
// most it makes pods up to, is its share of the slots that no job holds. keepUpTo, the most
// it keeps before it deletes one, is its share of the slots that no job whose start is
// decided holds: a job just accepted may be about to take one of the idle pods, and
// counting it here too would have the pool delete a pod a moment before the job takes
// another, then make one again. A job that starts cold counts here once its pod is
// recorded. Without slots (0), both are the pool's size.
func (cp *capacity) limits(name string) (makeUpTo, keepUpTo int) {
	size := cp.sizes[name]
	if cp.slots <= 0 {
		return size, size
	}
	return shareSlots(cp.slots-cp.holding, cp.sizes)[name], shareSlots(cp.slots-cp.decided, cp.sizes)[name]
}

// shareSlots shares free slots among pools of sizes (by environment name), fairly and the
// same way every time for the same numbers: every pool gets the same number of idle pods,
// a pool that asks for fewer gets what it asks and leaves the rest to the others, and what
// cannot be shared evenly goes one pod each to the larger pools in the order of their
// environments' names. Each pool's share only grows with free, so that a freed slot never
// takes a pod from a pool.
func shareSlots(free int, sizes map[string]int) map[string]int {
	out := make(map[string]int, len(sizes))
	total := 0
	for _, s := range sizes {
		total += s
	}
	if free >= total {
		for n, s := range sizes {
			out[n] = s
		}
		return out
	}
	if free <= 0 {
		for n := range sizes {
			out[n] = 0
		}
		return out
	}
	// The highest level every pool can be filled to, each up to its size.
	upTo := func(level int) int {
		sum := 0
		for _, s := range sizes {
			sum += min(s, level)
		}
		return sum
	}
	level := 0
	for upTo(level+1) <= free {
		level++
	}
	left := free - upTo(level)
	names := make([]string, 0, len(sizes))
	for n := range sizes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		out[n] = min(sizes[n], level)
		if left > 0 && sizes[n] > level {
			out[n]++
			left--
		}
	}
	return out
}

// capMessage says, for a platform engineer, why the pool keeps limit of its size idle
// pods: the operator's slots, busy with jobs or shared with other pools.
func (cp *capacity) capMessage(name string, limit int) string {
	const why = "an idle warm pod is only of use to a slot that is free to take a job"
	size, free := cp.sizes[name], max(cp.slots-cp.holding, 0)
	keeps := fmt.Sprintf("The pool keeps %d of its %d idle pods", limit, size)
	if limit == 0 {
		keeps = fmt.Sprintf("The pool keeps none of its %d idle pods", size)
	}
	asked := 0
	for _, s := range cp.sizes {
		asked += s
	}
	shared := fmt.Sprintf("shared among the warm pools of %d BuildEnvironments, which ask for %d idle pods in all", len(cp.sizes), asked)
	// Other pools have part of the free slots.
	isShared := free > 0 && limit < min(size, free)
	switch {
	case free == 0:
		return fmt.Sprintf("%s: all %d of the operator's slots are running jobs, and %s. It refills as jobs end.", keeps, cp.slots, why)
	case cp.holding == 0 && isShared:
		return fmt.Sprintf("%s: the operator's %d slots (--slots) are %s (%s).", keeps, cp.slots, shared, why)
	case cp.holding == 0:
		return fmt.Sprintf("%s: the operator has %d slots (--slots), and %s.", keeps, cp.slots, why)
	}
	busy := fmt.Sprintf("%d of the operator's %d slots are running jobs", cp.holding, cp.slots)
	if cp.holding == 1 {
		busy = fmt.Sprintf("1 of the operator's %d slots is running a job", cp.slots)
	}
	if isShared {
		return fmt.Sprintf("%s: %s, and the %s are %s (%s). It refills as jobs end.", keeps, busy, plural(free, "free slot", "free slots"), shared, why)
	}
	return fmt.Sprintf("%s: %s, and %s. It refills as jobs end.", keeps, busy, why)
}

// holdMessage says why the pool makes no pods: jobs wait for quota.
func (cp *capacity) holdMessage(namespace string) string {
	names := cp.quota
	more := ""
	if len(names) > 3 {
		names, more = names[:3], fmt.Sprintf(" and %d more", len(cp.quota)-3)
	}
	if len(cp.quota) == 1 {
		return fmt.Sprintf("The pool makes no pods while BuildJob %s waits for quota: a ResourceQuota of namespace %s refuses its pod, and warm pods give way to jobs. It refills once no job of the namespace waits for quota.",
			names[0], namespace)
	}
	return fmt.Sprintf("The pool makes no pods while %d BuildJobs (%s%s) wait for quota: ResourceQuotas of namespace %s refuse their pods, and warm pods give way to jobs. It refills once no job of the namespace waits for quota.",
		len(cp.quota), strings.Join(names, ", "), more, namespace)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
