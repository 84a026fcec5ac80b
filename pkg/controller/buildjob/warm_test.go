package buildjob_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// TestWarmPool: an environment with a pool of 2 gets two warm pods; a job of it takes one
// of them (no pod of its own is made), its pool makes another, and the job's pod, proving
// who it is with a token the API server minted for it, fetches the job through the real
// hand-off endpoint: the job's env as its own pod would have had it, and its token.
func TestWarmPool(t *testing.T) {
	w, h := startWarmWorld(t, 2)
	reg, sa, audience := h.reg, h.sa, h.audience
	idle := w.waitWarmPods(2, 0)
	for _, p := range idle {
		w.run(p.Name)
	}

	j := w.acceptJob()
	w.createBuildJob(j)
	taken := w.waitAssigned()
	assert.Equal(t, validation.LabelValue(j.name), taken.Labels[podbuilder.LabelBuildJob])
	assert.Empty(t, taken.Finalizers, "a warm pod is not held once assigned, as a job's own pod is not")
	assert.Equal(t, "my-app", taken.Labels[bkv1.LabelPipeline], "the job's own labels")
	err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: podbuilder.PodName(w.buildJob(j.name))}, &corev1.Pod{})
	assert.True(t, apierrors.IsNotFound(err), "the job got a pod of its own too: %v", err)

	// The pool is made whole again: two idle, one assigned.
	w.waitWarmPods(2, 1)
	require.Eventually(t, func() bool {
		e := &bkv1.BuildEnvironment{}
		return w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, e) == nil &&
			e.Status.WarmPool != nil && e.Status.WarmPool.Idle == 2 && e.Status.WarmPool.Assigned == 1
	}, waitFor, tick, "the environment's status does not show 2 idle and 1 assigned warm pods")
	// So do the pool's metrics, and the job's status and start count say it started warm.
	w.waitWarmPoolGauges(warmPoolGauges{size: 2, idle: 2, assigned: 1})
	started := w.waitBuildJob(j.name, "WarmStart recorded", func(bj *bkv1.BuildJob) bool { return condition(bj, bkv1.ConditionWarmStart) != nil })
	ws := condition(started, bkv1.ConditionWarmStart)
	assert.Equal(t, metav1.ConditionTrue, ws.Status, statusJSON(started))
	assert.Equal(t, bkv1.ReasonWarmPodAssigned, ws.Reason)
	assert.Contains(t, ws.Message, taken.Name, "the condition names the warm pod")
	assert.True(t, conditionTrue(started, bkv1.ConditionPodCreated), "WarmStart came with the write that recorded the pod: %s", statusJSON(started))
	assert.Equal(t, map[string]float64{bkv1.ReasonWarmPodAssigned: 1}, w.jobStarts())

	got := w.fetchHandoff(taken, sa, audience, reg)
	assert.Equal(t, j.id, got.ID)
	assert.Equal(t, j.name, got.BuildJob)
	assert.Equal(t, j.token, got.Token, "the job token, from the token Secret")
	assert.Equal(t, j.id, got.Env[podcontract.EnvJobID])
	assert.Equal(t, w.bk.Endpoint(), got.Env[podcontract.EnvEndpoint])
	assert.NotContains(t, got.Env, podcontract.EnvAccessToken, "the token travels in its own field")

	// From here the warm pod is any job's pod: it runs the job, its outcome is reported
	// and it is reaped.
	progress := w.supervisor(j).write("hello from a warm pod\n").finished(0)
	w.kubelet(taken.Name, terminate(0, "Completed", progress))
	bj := w.waitReported(j.name)
	assert.Equal(t, bkv1.PhaseSucceeded, bj.Status.Phase)
	assert.Equal(t, taken.Name, bj.Status.PodName)
	assert.True(t, conditionTrue(bj, bkv1.ConditionWarmStart), statusJSON(bj))
	require.Eventually(t, func() bool { return podIsGoing(w, taken.Name) }, waitFor, tick, "the warm pod was not reaped")
	assert.Equal(t, handoff.StateUnknown, reg.State(handoff.RefTo(taken)), "the registry let go of the reaped pod")
}

// TestWarmPodStops: a warm pod that stops before its supervisor took the job (the
// registry says it was assigned, not handed off) loses no job: the job is withdrawn from
// it and starts cold, in a pod of its own built afresh (none of the warm pod's deadline),
// runs and is reported, and the dead warm pod is let go of. One that stops after its
// hand-off is handled as any job pod that dies: the job fails with the usual reason, and
// no pod of its own is made.
func TestWarmPodStops(t *testing.T) {
	deleteIt := func(w *world, pod *corev1.Pod) {
		require.NoError(w.t, w.c.Delete(w.ctx, pod, client.Preconditions{UID: &pod.UID}))
	}
	evictIt := func(w *world, pod *corev1.Pod) {
		// The kubelet's eviction under node pressure: the pod fails, its containers
		// killed.
		w.kubelet(pod.Name, func(p *corev1.Pod) {
			now := metav1.Now()
			p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
				Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet", LastTransitionTime: now,
				Message: "The node was low on resource: memory."})
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: "Error", StartedAt: now, FinishedAt: now}}
		})
	}
	// removed by force, with its node: gone without a trace.
	removeIt := func(w *world, pod *corev1.Pod) {
		p := &corev1.Pod{}
		require.NoError(w.t, w.c.Get(w.ctx, client.ObjectKeyFromObject(pod), p))
		p.Finalizers = nil
		require.NoError(w.t, w.c.Update(w.ctx, p))
		require.NoError(w.t, w.c.Delete(w.ctx, p, client.GracePeriodSeconds(0)))
		w.waitGone(p)
	}
	// deleted, and its supervisor stopped by the kubelet without a record.
	deleteAndStop := func(w *world, pod *corev1.Pod) {
		deleteIt(w, pod)
		w.kubelet(pod.Name, func(p *corev1.Pod) {
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 143, Reason: "Error", StartedAt: metav1.Now(), FinishedAt: metav1.Now()}}
		})
	}
	failIt := func(w *world, pod *corev1.Pod) {
		// The supervisor killed without a record, after it took the job.
		w.kubelet(pod.Name, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: "Error", StartedAt: metav1.Now(), FinishedAt: metav1.Now()}}
		})
	}
	cases := []struct {
		name string
		// handedOff: the pod's supervisor took its job before the pod stopped.
		handedOff bool
		stop      func(*world, *corev1.Pod)
		// reason is the job's, when it fails as any job whose pod dies.
		reason string
	}{
		{name: "deleted before its hand-off", stop: deleteIt},
		{name: "evicted before its hand-off", stop: evictIt},
		{name: "gone before its hand-off", stop: removeIt},
		{name: "failed after its hand-off", handedOff: true, stop: failIt, reason: bkv1.ReasonPodFailed},
		{name: "deleted after its hand-off", handedOff: true, stop: deleteAndStop, reason: bkv1.ReasonPodDeleted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, h := startWarmWorld(t, 1)
			idle := w.waitWarmPods(1, 0)
			w.run(idle[0].Name)
			// The warm pod has waited an hour: its deadline, once assigned, is an hour
			// longer than the job's timeout, which a cold pod must not inherit.
			w.kubelet(idle[0].Name, func(p *corev1.Pod) { p.Status.StartTime = &metav1.Time{Time: time.Now().Add(-time.Hour)} })

			j := w.acceptJob()
			history := w.watchStatus(j.name)
			bj := w.createBuildJob(j, gen.SetBuildJobTimeoutMinutes(10))
			taken := w.waitAssigned()
			require.NotNil(t, taken.Spec.ActiveDeadlineSeconds)
			// The status records the warm pod (its supervisor's container runs) before it
			// stops, as it would on a real node.
			recorded := w.waitBuildJob(j.name, "the warm pod recorded", func(bj *bkv1.BuildJob) bool { return bj.Status.PodName == taken.Name })
			assert.True(t, conditionTrue(recorded, bkv1.ConditionWarmStart), "a job in a warm pod says so: %s", statusJSON(recorded))
			defer func() { assertNoWriteForWarmStart(t, history) }()
			if tc.handedOff {
				require.Equal(t, j.id, w.fetchHandoff(taken, h.sa, h.audience, h.reg).ID)
			}
			require.Equal(t, map[bool]handoff.State{false: handoff.StateAssigned, true: handoff.StateHandedOff}[tc.handedOff], h.reg.State(handoff.RefTo(taken)))
			tc.stop(w, taken)

			coldName := podbuilder.PodName(bj)
			if tc.handedOff {
				got := w.waitReported(j.name)
				assert.Equal(t, bkv1.PhaseFailed, got.Status.Phase, statusJSON(got))
				finished := meta.FindStatusCondition(got.Status.Conditions, bkv1.ConditionFinished)
				require.NotNil(t, finished, statusJSON(got))
				assert.Equal(t, tc.reason, finished.Reason, statusJSON(got))
				assert.Equal(t, taken.Name, got.Status.PodName)
				err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: coldName}, &corev1.Pod{})
				assert.True(t, apierrors.IsNotFound(err), "a job its warm pod took got a pod of its own too: %v", err)
				assert.NotContains(t, w.eventReasons(j.name), buildjob.EventStartedCold)
				ws := condition(got, bkv1.ConditionWarmStart)
				require.NotNil(t, ws, statusJSON(got))
				assert.Equal(t, bkv1.ReasonWarmPodAssigned, ws.Reason, "it ran, and ended, in its warm pod")
				assert.Equal(t, map[string]float64{bkv1.ReasonWarmPodAssigned: 1}, w.jobStarts())
				return
			}

			w.waitEvents(j.name, buildjob.EventStartedCold)
			cold := w.waitPod(coldName)
			assert.Empty(t, cold.Labels[podbuilder.LabelWarmPool], "the job's new pod is its own, not another warm pod")
			want, err := podbuilder.Build(w.buildJob(j.name), w.environment(), w.podOptions())
			require.NoError(t, err)
			require.NotNil(t, want.Spec.ActiveDeadlineSeconds)
			assert.Equal(t, *want.Spec.ActiveDeadlineSeconds, *cold.Spec.ActiveDeadlineSeconds, "the cold pod has the job's own deadline")
			assert.Greater(t, *taken.Spec.ActiveDeadlineSeconds, *cold.Spec.ActiveDeadlineSeconds, "the warm pod's deadline counted its wait")
			_, err = h.reg.Claim(w.ctx, handoff.RefTo(taken))
			require.ErrorIs(t, err, handoff.ErrUnknownPod, "the dead warm pod's supervisor gets no job")

			// The dead warm pod is let go of: going, and no longer the job's.
			require.Eventually(t, func() bool {
				p := &corev1.Pod{}
				err := w.c.Get(w.ctx, client.ObjectKeyFromObject(taken), p)
				if apierrors.IsNotFound(err) {
					return true
				}
				return err == nil && p.UID == taken.UID && !p.DeletionTimestamp.IsZero() && !contains(p.Finalizers, podbuilder.PodFinalizer) &&
					p.Labels[podbuilder.LabelBuildJob] == "" && metav1.GetControllerOf(p) == nil
			}, waitFor, tick, "the dead warm pod was not let go of")

			w.run(coldName)
			progress := w.supervisor(j).write("hello from a cold pod\n").finished(0)
			w.kubelet(coldName, terminate(0, "Completed", progress))
			got := w.waitReported(j.name)
			assert.Equal(t, bkv1.PhaseSucceeded, got.Status.Phase, statusJSON(got))
			assert.Equal(t, coldName, got.Status.PodName)
			assert.Equal(t, fakebuildkite.StateFinished, w.bkSnapshot(j.id).State)
			ws := condition(got, bkv1.ConditionWarmStart)
			require.NotNil(t, ws, statusJSON(got))
			assert.Equal(t, metav1.ConditionFalse, ws.Status, statusJSON(got))
			assert.Equal(t, bkv1.ReasonWarmPodStopped, ws.Reason)
			assert.Contains(t, ws.Message, "Warm pod "+taken.Name+" stopped before taking the job")
			// Two starts: the warm one, and the cold one after it.
			assert.Equal(t, map[string]float64{bkv1.ReasonWarmPodAssigned: 1, bkv1.ReasonWarmPodStopped: 1}, w.jobStarts())
		})
	}
}

// TestWarmStartCold: a job that starts in a pod of its own beside a warm pool says why in
// its WarmStart condition, which comes with the status write that records its pod, and is
// counted by that reason; a job whose environment has no pool, or whose operator runs no
// warm pools, has no such condition and is not counted.
func TestWarmStartCold(t *testing.T) {
	cases := []struct {
		name string
		// start is the world: a controller, and the environment's pool.
		start func(t *testing.T) *world
		mods  []gen.BuildJobModifier
		// reason and message are the WarmStart condition's; "" for none.
		reason, message string
		event           bool
	}{
		{
			name: "no idle warm pod",
			// A pool of 1 whose keeper does not run: the pool is empty.
			start: func(t *testing.T) *world {
				w := prepareWorld(t)
				w.startController(warmOptions(w, handoff.NewRegistry(), "buildkite-operator."+w.ns+".handoff"))
				w.setWarmPoolSize(1)
				return w
			},
			reason:  bkv1.ReasonNoIdleWarmPod,
			message: "No warm pod of BuildEnvironment " + envName + " was idle",
		},
		{
			name: "no warm pod fits",
			start: func(t *testing.T) *world {
				w, _ := startWarmWorld(t, 1)
				w.waitWarmPods(1, 0)
				return w
			},
			mods: []gen.BuildJobModifier{gen.SetBuildJobResources(corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}})},
			reason:  bkv1.ReasonNoWarmPodFits,
			message: "the job asks for its own resources",
			event:   true,
		},
		{
			name: "no pool",
			start: func(t *testing.T) *world {
				w, _ := startWarmWorld(t, 0)
				return w
			},
		},
		{
			name: "warm pools off",
			start: func(t *testing.T) *world {
				w := newWorld(t, testOptions())
				w.setWarmPoolSize(1)
				return w
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.start(t)
			j := w.acceptJob()
			history := w.watchStatus(j.name)
			bj := w.createBuildJob(j, tc.mods...)
			w.waitPod(podbuilder.PodName(bj))
			got := w.waitBuildJob(j.name, "the pod recorded", func(bj *bkv1.BuildJob) bool { return conditionTrue(bj, bkv1.ConditionPodCreated) })
			ws := condition(got, bkv1.ConditionWarmStart)
			if tc.reason == "" {
				assert.Nil(t, ws, statusJSON(got))
				assert.Empty(t, w.jobStarts())
				return
			}
			require.NotNil(t, ws, "the write that recorded the pod says why it is cold: %s", statusJSON(got))
			assert.Equal(t, metav1.ConditionFalse, ws.Status)
			assert.Equal(t, tc.reason, ws.Reason)
			assert.Contains(t, ws.Message, tc.message)
			assert.Equal(t, map[string]float64{tc.reason: 1}, w.jobStarts())
			if tc.event {
				w.waitEvents(j.name, buildjob.EventStartedCold)
			} else {
				assert.NotContains(t, w.eventReasons(j.name), buildjob.EventStartedCold)
			}
			assertNoWriteForWarmStart(t, history)
		})
	}
}

// TestWarmPoolMetricsGo: an environment's warm-pool series (its gauges and its start
// counts) go when its pool goes to 0, come back with the pool, and go when the
// environment is deleted.
func TestWarmPoolMetricsGo(t *testing.T) {
	w, _ := startWarmWorld(t, 1)
	w.waitWarmPods(1, 0)
	w.waitWarmPoolGauges(warmPoolGauges{size: 1, idle: 1})
	// A start counted: a job no warm pod fits.
	j := w.acceptJob()
	w.createBuildJob(j, gen.SetBuildJobResources(corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}}))
	require.Eventually(t, func() bool { return w.jobStarts()[bkv1.ReasonNoWarmPodFits] == 1 }, waitFor, tick, "the cold start was not counted")

	w.setWarmPoolSize(0)
	w.waitWarmPods(0, 0)
	require.Eventually(t, func() bool { return len(w.warmPoolSeries()) == 0 }, waitFor, tick,
		"a pool gone to 0 keeps its series: %v", w.warmPoolSeries())

	w.setWarmPoolSize(1)
	w.waitWarmPoolGauges(warmPoolGauges{size: 1, idle: 1})

	require.NoError(t, w.c.Delete(w.ctx, w.environment()))
	require.Eventually(t, func() bool { return len(w.warmPoolSeries()) == 0 }, waitFor, tick,
		"a deleted environment keeps its series: %v", w.warmPoolSeries())
}

// setWarmPoolSize sets the size of the world's environment's warm pool.
func (w *world) setWarmPoolSize(size int32) {
	w.t.Helper()
	require.NoError(w.t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		e := w.environment()
		e.Spec.WarmPool = &bkv1.WarmPool{Size: size}
		return w.c.Update(w.ctx, e)
	}))
}

// assertNoWriteForWarmStart checks, in the statuses a BuildJob went through, that the
// WarmStart condition never changed alone: it rides on status writes made anyway.
func assertNoWriteForWarmStart(t *testing.T, history *statusHistory) {
	t.Helper()
	// The status less the condition and what every write carries (observedGeneration,
	// and acceptedAt, which the first write brings in from the BuildJob's annotation).
	without := func(st bkv1.BuildJobStatus) bkv1.BuildJobStatus {
		st = *st.DeepCopy()
		meta.RemoveStatusCondition(&st.Conditions, bkv1.ConditionWarmStart)
		st.ObservedGeneration, st.Times.AcceptedAt = 0, nil
		return st
	}
	seen := history.list()
	require.NotEmpty(t, seen)
	var prev bkv1.BuildJobStatus
	for i, st := range seen {
		was, is := meta.FindStatusCondition(prev.Conditions, bkv1.ConditionWarmStart), meta.FindStatusCondition(st.Conditions, bkv1.ConditionWarmStart)
		if !equality.Semantic.DeepEqual(was, is) {
			assert.False(t, equality.Semantic.DeepEqual(without(prev), without(st)),
				"status %d changed only the WarmStart condition, in a write of its own: %+v", i, is)
		}
		prev = st
	}
}

// warmPoolGauges are the values of an environment's warm-pool gauges.
type warmPoolGauges struct{ size, idle, assigned float64 }

// waitWarmPoolGauges waits until the world's environment's gauges say want.
func (w *world) waitWarmPoolGauges(want warmPoolGauges) {
	w.t.Helper()
	require.EventuallyWithT(w.t, func(c *assert.CollectT) {
		got := w.warmPoolSeries()
		for name, v := range map[string]float64{"size": want.size, "pods/idle": want.idle, "pods/assigned": want.assigned} {
			if assert.Contains(c, got, name) {
				assert.Equal(c, v, got[name], name)
			}
		}
	}, waitFor, tick, "the warm pool's gauges")
}

// jobStarts are the starts of the world's environment's jobs counted by
// buildkite_operator_warm_pool_job_starts_total, by reason.
func (w *world) jobStarts() map[string]float64 {
	w.t.Helper()
	out := map[string]float64{}
	for k, v := range w.warmPoolSeries() {
		if reason, ok := strings.CutPrefix(k, "job_starts_total/"); ok {
			out[reason] = v
		}
	}
	return out
}

// warmPoolSeries reads the world's environment's buildkite_operator_warm_pool_* series
// from controller-runtime's registry, which agentd serves: each named by the metric's
// name less the prefix, then /its state or reason label, if it has one.
func (w *world) warmPoolSeries() map[string]float64 {
	w.t.Helper()
	families, err := crmetrics.Registry.Gather()
	require.NoError(w.t, err)
	const prefix = "buildkite_operator_warm_pool_"
	out := map[string]float64{}
	for _, f := range families {
		name, ok := strings.CutPrefix(f.GetName(), prefix)
		if !ok {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["environment_namespace"] != w.ns || labels["environment"] != envName {
				continue
			}
			key := name
			if v := labels["state"] + labels["reason"]; v != "" {
				key += "/" + v
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// warmHandoff is what a test needs to fetch a warm pod's job as its supervisor does.
type warmHandoff struct {
	reg      *handoff.Registry
	sa       *corev1.ServiceAccount
	audience string
}

// startWarmWorld is a world whose controller hands jobs to warm pods, and whose
// environment keeps a pool of size.
func startWarmWorld(t *testing.T, size int32) (*world, warmHandoff) {
	w := prepareWorld(t)
	reg := handoff.NewRegistry()
	reg.MarkReady()
	audience := "buildkite-operator." + w.ns + ".handoff"
	opts := warmOptions(w, reg, audience)
	w.startController(opts)
	w.startWarmPools(opts, reg)
	// envtest runs no controller manager to make the namespace's default ServiceAccount.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: w.ns}}
	if err := w.c.Create(w.ctx, sa); !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	environment := w.environment()
	environment.Spec.WarmPool = &bkv1.WarmPool{Size: size}
	require.NoError(t, w.c.Update(w.ctx, environment))
	return w, warmHandoff{reg: reg, sa: sa, audience: audience}
}

func warmOptions(w *world, reg *handoff.Registry, audience string) buildjob.Options {
	opts := testOptions()
	opts.AgentEndpoint = w.bk.Endpoint()
	opts.Handoff, opts.HandoffURL, opts.HandoffAudience = reg, "https://agentd.test/handoff", audience
	return opts
}

// podOptions are the pod settings of the world's warm controller.
func (w *world) podOptions() podbuilder.Options {
	return warmOptions(w, nil, "buildkite-operator."+w.ns+".handoff").PodOptions()
}

func (w *world) environment() *bkv1.BuildEnvironment {
	w.t.Helper()
	e := &bkv1.BuildEnvironment{}
	require.NoError(w.t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, e))
	return e
}

// waitAssigned waits for a warm pod to be assigned a job, and returns it.
func (w *world) waitAssigned() *corev1.Pod {
	w.t.Helper()
	var taken *corev1.Pod
	require.Eventually(w.t, func() bool {
		for _, p := range w.warmPods() {
			if owner := metav1.GetControllerOf(&p); owner != nil && owner.Kind == "BuildJob" {
				taken = p.DeepCopy()
				return true
			}
		}
		return false
	}, waitFor, tick, "no warm pod was assigned the job")
	return taken
}

// startWarmPools runs the BuildEnvironment controller with warm pools, as agentd does.
func (w *world) startWarmPools(opts buildjob.Options, reg *handoff.Registry) {
	w.t.Helper()
	copts := cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}}
	buildjob.ConfigureCache(&copts)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  copts,
	})
	require.NoError(w.t, err)
	warm := &buildenvironment.WarmPools{Pod: opts.PodOptions(), Registry: reg}
	require.NoError(w.t, buildenvironment.Setup(mgr, warm, controller.SetupOptions{SkipNameValidation: true}))
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		require.NoError(w.t, <-done)
	})
}

// warmPods lists the pool's pods; none when the list fails (it is called from
// Eventually's goroutine, which must not end the test).
func (w *world) warmPods() []corev1.Pod {
	pods := &corev1.PodList{}
	if err := w.c.List(w.ctx, pods, client.InNamespace(w.ns), client.MatchingLabels{podbuilder.LabelWarmPool: envName}); err != nil {
		return nil
	}
	return pods.Items
}

// waitWarmPods waits until the pool has idle unassigned pods and assigned ones, none
// being deleted, and returns the idle ones.
func (w *world) waitWarmPods(idle, assigned int) []corev1.Pod {
	w.t.Helper()
	var free []corev1.Pod
	require.Eventually(w.t, func() bool {
		free = nil
		taken := 0
		for _, p := range w.warmPods() {
			switch owner := metav1.GetControllerOf(&p); {
			case !p.DeletionTimestamp.IsZero():
			case owner != nil && owner.Kind == "BuildJob":
				taken++
			default:
				free = append(free, p)
			}
		}
		return len(free) == idle && taken == assigned
	}, waitFor, tick, "the pool never had %d idle and %d assigned pods (%d pods; the environment's status: %s)", idle, assigned, len(w.warmPods()), w.environmentStatus())
	return free
}

func (w *world) environmentStatus() string {
	e := &bkv1.BuildEnvironment{}
	if err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, e); err != nil {
		return err.Error()
	}
	b, _ := json.Marshal(e.Status)
	return string(b)
}

// fetchHandoff is the pod's supervisor fetching its job: with a token bound to the pod
// and minted for audience, as the kubelet projects it, from the hand-off endpoint.
func (w *world) fetchHandoff(pod *corev1.Pod, sa *corev1.ServiceAccount, audience string, reg *handoff.Registry) handoffclient.Job {
	w.t.Helper()
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		Audiences:      []string{audience},
		BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	require.NoError(w.t, w.c.SubResource("token").Create(w.ctx, sa, tr))
	h, err := handoff.NewHandler(handoff.Config{Audience: audience, Client: w.c, Assignments: reg})
	require.NoError(w.t, err)
	srv := httptest.NewTLSServer(h)
	w.t.Cleanup(srv.Close)
	dir := w.t.TempDir()
	tokenPath, caPath := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	require.NoError(w.t, os.WriteFile(tokenPath, []byte(tr.Status.Token), 0o600))
	require.NoError(w.t, os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	defer cancel()
	job, err := (&handoffclient.Client{URL: srv.URL, TokenPath: tokenPath, CAPath: caPath}).Fetch(ctx)
	require.NoError(w.t, err)
	return job
}
