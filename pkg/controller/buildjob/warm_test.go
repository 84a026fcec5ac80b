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
)

// TestWarmPool: an environment with a pool of 2 gets two warm pods; a job of it takes one
// of them (no pod of its own is made), its pool makes another, and the job's pod, proving
// who it is with a token the API server minted for it, fetches the job through the real
// hand-off endpoint: the job's env as its own pod would have had it, and its token.
func TestWarmPool(t *testing.T) {
	w := prepareWorld(t)
	reg := handoff.NewRegistry()
	reg.MarkReady()
	audience := "buildkite-operator." + w.ns + ".handoff"
	opts := testOptions()
	opts.AgentEndpoint = w.bk.Endpoint()
	opts.Handoff, opts.HandoffURL, opts.HandoffAudience = reg, "https://agentd.test/handoff", audience
	w.startController(opts)
	w.startWarmPools(opts, reg)
	// envtest runs no controller manager to make the namespace's default ServiceAccount.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: w.ns}}
	if err := w.c.Create(w.ctx, sa); !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}

	environment := &bkv1.BuildEnvironment{}
	require.NoError(t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, environment))
	environment.Spec.WarmPool = &bkv1.WarmPool{Size: 2}
	require.NoError(t, w.c.Update(w.ctx, environment))

	idle := w.waitWarmPods(2, 0)
	for _, p := range idle {
		w.run(p.Name)
	}

	j := w.acceptJob()
	w.createBuildJob(j)
	var taken *corev1.Pod
	require.Eventually(t, func() bool {
		for _, p := range w.warmPods() {
			if metav1.GetControllerOf(&p) != nil && metav1.GetControllerOf(&p).Kind == "BuildJob" {
				taken = p.DeepCopy()
				return true
			}
		}
		return false
	}, waitFor, tick, "no warm pod was assigned the job")
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
