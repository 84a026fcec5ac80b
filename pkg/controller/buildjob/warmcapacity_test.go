package buildjob_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// ownResources makes a job fit no warm pod: it starts cold, in a pod of its own.
var ownResources = gen.SetBuildJobResources(corev1.ResourceRequirements{
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}})

// TestWarmPoolSlots: with 3 slots, a pool of 3 keeps no more idle pods than the slots no
// job holds. A cold job, once its pod is recorded, takes one idle pod's place; a job that
// takes a warm pod is not replaced; with every slot busy the pool keeps none, and says
// why in its status; a job that ends lets the pool make one again.
func TestWarmPoolSlots(t *testing.T) {
	w := startWarmOperator(t, 3, 3)
	w.waitIdleWarmPods(map[string]int{envName: 3})

	cold1 := w.acceptJob()
	bj1 := w.createBuildJob(cold1, ownResources)
	w.waitPod(podbuilder.PodName(bj1))
	w.waitIdleWarmPods(map[string]int{envName: 2})
	w.waitPoolMessage(envName, "The pool keeps 2 of its 3 idle pods: 1 of the operator's 3 slots is running a job, and an idle warm pod is only of use to a slot that is free to take a job. It refills as jobs end.")

	warm := w.acceptJob()
	w.createBuildJob(warm)
	w.waitAssigned()
	w.waitWarmPods(1, 1) // not made whole again, as a pool without slots is (TestWarmPool)

	cold2 := w.acceptJob()
	w.createBuildJob(cold2, ownResources)
	w.waitWarmPods(0, 1)
	w.waitPoolMessage(envName, "The pool keeps none of its 3 idle pods: all 3 of the operator's slots are running jobs")

	w.endColdJob(cold1)
	w.waitWarmPods(1, 1)
	w.waitPoolMessage(envName, "The pool keeps 1 of its 3 idle pods: 2 of the operator's 3 slots are running jobs")
}

// TestWarmPoolsShareSlots: two pools of 2 share 3 slots: one each, and the third to the
// first environment by name; a job in flight leaves 2, one each, and the status of the
// pool that gave one up says so; the job's end gives it back.
func TestWarmPoolsShareSlots(t *testing.T) {
	const other = "rust" // after envName ("go") by name
	w := startWarmOperator(t, 2, 3)
	require.NoError(t, w.c.Create(w.ctx, gen.BuildEnvironment(other,
		gen.SetBuildEnvironmentNamespace(w.ns),
		gen.SetBuildEnvironmentImage("bk-operator/job:dev"),
		gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memoryLimit)},
		}),
		func(e *bkv1.BuildEnvironment) { e.Spec.WarmPool = &bkv1.WarmPool{Size: 2} },
	)))
	w.waitIdleWarmPods(map[string]int{envName: 2, other: 1})
	w.waitPoolMessage(other, "The pool keeps 1 of its 2 idle pods: the operator's 3 slots (--slots) are shared among the warm pools of 2 BuildEnvironments, which ask for 4 idle pods in all")

	j := w.acceptJob()
	w.createBuildJob(j, ownResources)
	w.waitIdleWarmPods(map[string]int{envName: 1, other: 1})
	w.waitPoolMessage(envName, "The pool keeps 1 of its 2 idle pods: 1 of the operator's 3 slots is running a job, and the 2 free slots are shared among the warm pools of 2 BuildEnvironments")

	w.endColdJob(j)
	w.waitIdleWarmPods(map[string]int{envName: 2, other: 1})
	w.waitPoolMessage(envName, "")
}

// TestWarmPoolGivesWayToQuota: a ResourceQuota that refuses a cold job's pod (a real one,
// enforced by the API server's admission; the test sets its status as the quota
// controller, which envtest does not run, would) has the controller delete idle warm pods
// to make room, one per refusal, each named in an event on the BuildJob; the pool makes no
// pod while the job waits, and says so, and is made whole once the job has its pod.
//
// The quota counts only pods with a deadline (scope Terminating): the job's, as it has a
// timeout, and no idle warm pod, which has none. So the job waits as long as the test
// wants, while a pool that did not hold back could make its pods again at once.
func TestWarmPoolGivesWayToQuota(t *testing.T) {
	w := startWarmOperator(t, 2, 0)
	before := map[string]bool{}
	for _, p := range w.waitWarmPods(2, 0) {
		before[p.Name] = true
	}
	q := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "jobs-with-deadlines", Namespace: w.ns},
		Spec: corev1.ResourceQuotaSpec{
			Hard:   corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			Scopes: []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeTerminating},
		},
	}
	require.NoError(t, w.c.Create(w.ctx, q))
	q.Status = corev1.ResourceQuotaStatus{
		Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
		Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
	}
	require.NoError(t, w.c.Status().Update(w.ctx, q))

	j := w.acceptJob()
	bj := w.createBuildJob(j, ownResources, gen.SetBuildJobTimeoutMinutes(10))
	w.waitBuildJob(j.name, "waiting for quota", func(bj *bkv1.BuildJob) bool {
		c := meta.FindStatusCondition(bj.Status.Conditions, bkv1.ConditionPodCreated)
		return c != nil && c.Reason == bkv1.ReasonWaitingForQuota
	})
	// Both idle pods go, over the job's refusals, each named in an event.
	var removed []string
	require.Eventually(t, func() bool {
		removed = w.warmPodsRemovedFor(j.name)
		return len(removed) == 2
	}, waitFor, tick, "the idle warm pods were not removed for the job: events name %v", removed)
	for _, name := range removed {
		assert.True(t, before[name], "an event names pod %s, which was no idle warm pod", name)
		w.waitGone(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name}})
	}
	w.waitPoolMessage(envName, "The pool makes no pods while BuildJob "+j.name+" waits for quota: a ResourceQuota of namespace "+w.ns+" refuses its pod")
	// And makes none while it waits.
	w.waitWarmPods(0, 0)
	for range 10 {
		assert.Empty(t, w.warmPods(), "the pool made a pod while a job waits for quota")
		time.Sleep(100 * time.Millisecond)
	}

	require.NoError(t, w.c.Delete(w.ctx, q))
	w.waitPod(podbuilder.PodName(bj))
	w.waitWarmPods(2, 0)
	w.waitPoolMessage(envName, "")
	got := w.buildJob(j.name)
	assert.True(t, conditionTrue(got, bkv1.ConditionPodCreated), statusJSON(got))
}

// startWarmOperator is a world with the controller and the warm pools of one manager, as
// agentd runs them, the pools sharing slots (0: no cap), and the world's environment
// keeping a pool of size.
func startWarmOperator(t *testing.T, size int32, slots int) *world {
	w := prepareWorld(t)
	reg := handoff.NewRegistry()
	reg.MarkReady()
	opts := warmOptions(w, reg, "buildkite-operator."+w.ns+".handoff")
	copts := cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}}
	buildjob.ConfigureCache(&copts)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  copts,
	})
	require.NoError(t, err)
	require.NoError(t, buildjob.Setup(mgr, opts, controller.SetupOptions{SkipNameValidation: true}))
	warm := &buildenvironment.WarmPools{Pod: opts.PodOptions(), Registry: reg, Slots: slots}
	require.NoError(t, buildenvironment.Setup(mgr, warm, controller.SetupOptions{SkipNameValidation: true}))
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	w.setWarmPoolSize(size)
	return w
}

// idleWarmPods counts the idle warm pods (not assigned, not being deleted) by environment.
func (w *world) idleWarmPods() map[string]int {
	pods := &corev1.PodList{}
	if err := w.c.List(w.ctx, pods, client.InNamespace(w.ns), client.HasLabels{podbuilder.LabelWarmPool}); err != nil {
		return nil
	}
	out := map[string]int{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if owner := metav1.GetControllerOf(p); owner != nil && owner.Kind == "BuildEnvironment" && p.DeletionTimestamp.IsZero() {
			out[owner.Name]++
		}
	}
	return out
}

// waitIdleWarmPods waits until the environments' pools have want idle pods.
func (w *world) waitIdleWarmPods(want map[string]int) {
	w.t.Helper()
	var got map[string]int
	require.Eventually(w.t, func() bool {
		got = w.idleWarmPods()
		for name, n := range want {
			if got[name] != n {
				return false
			}
		}
		return true
	}, waitFor, tick, "idle warm pods: want %v, got %v", want, &got)
}

// waitPoolMessage waits until the environment's status.warmPool.message starts with want
// ("" for none).
func (w *world) waitPoolMessage(name, want string) {
	w.t.Helper()
	require.EventuallyWithT(w.t, func(c *assert.CollectT) {
		e := &bkv1.BuildEnvironment{}
		if !assert.NoError(c, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, e)) ||
			!assert.NotNil(c, e.Status.WarmPool, "no status.warmPool") {
			return
		}
		got := e.Status.WarmPool.Message
		if want == "" {
			assert.Empty(c, got, "status.warmPool.message")
			return
		}
		assert.True(c, strings.HasPrefix(got, want), "status.warmPool.message: want %q, got %q", want, got)
	}, waitFor, tick, "BuildEnvironment %s: status.warmPool.message", name)
}

// endColdJob runs j's own pod to a successful end and waits for the job to be reported.
func (w *world) endColdJob(j bkJob) {
	w.t.Helper()
	name := podbuilder.PodName(w.buildJob(j.name))
	w.run(name)
	progress := w.supervisor(j).write("done\n").finished(0)
	w.kubelet(name, terminate(0, "Completed", progress))
	w.waitReported(j.name)
}

// warmPodsRemovedFor names the pods the events of the BuildJob say were removed to make
// room for its pod.
func (w *world) warmPodsRemovedFor(job string) []string {
	var list corev1.EventList
	if err := w.c.List(w.ctx, &list, client.InNamespace(w.ns)); err != nil {
		return nil
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind != "BuildJob" || e.InvolvedObject.Name != job || e.Reason != buildjob.EventWarmPodRemoved {
			continue
		}
		if e.Related != nil && strings.Contains(e.Message, "Deleted idle warm pod "+e.Related.Name+" of BuildEnvironment "+envName) {
			out = append(out, e.Related.Name)
		}
	}
	return out
}
