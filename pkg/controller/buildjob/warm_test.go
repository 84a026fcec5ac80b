package buildjob_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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
	assert.Contains(t, taken.Finalizers, podbuilder.PodFinalizer)
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
			bj := w.createBuildJob(j, gen.SetBuildJobTimeoutMinutes(10))
			taken := w.waitAssigned()
			require.NotNil(t, taken.Spec.ActiveDeadlineSeconds)
			// The status records the warm pod (its supervisor's container runs) before it
			// stops, as it would on a real node.
			w.waitBuildJob(j.name, "the warm pod recorded", func(bj *bkv1.BuildJob) bool { return bj.Status.PodName == taken.Name })
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
		})
	}
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
