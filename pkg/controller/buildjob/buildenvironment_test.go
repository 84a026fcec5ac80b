package buildjob_test

import (
	"context"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// A job whose environment is missing or forbidden is told, in its Buildkite log, which
// environments its pipeline may use and the nearest name, with no Kubernetes field paths
// or kubectl commands.
func TestUnusableEnvironmentIsExplainedToTheAuthor(t *testing.T) {
	w := newWorld(t, testOptions())
	for _, e := range []*bkv1.BuildEnvironment{
		gen.BuildEnvironment("go-1-26", gen.SetBuildEnvironmentNamespace(w.ns), gen.SetBuildEnvironmentAllowedPipelines("my-*")),
		gen.BuildEnvironment("payments", gen.SetBuildEnvironmentNamespace(w.ns), gen.SetBuildEnvironmentAllowedPipelines("payments-*")),
	} {
		require.NoError(t, w.c.Create(w.ctx, e))
	}
	cases := []struct {
		name  string
		asked string
		want  []string
	}{
		{
			name:  "missing",
			asked: "go-1-25",
			want: []string{
				`BuildEnvironment "go-1-25" does not exist.`,
				`Did you mean "go-1-26"?`,
				`Pipeline "my-app" may use "go", "go-1-26";`,
			},
		},
		{
			name:  "forbidden",
			asked: "payments",
			want: []string{
				`The pipeline "my-app" may not use BuildEnvironment "payments", which is for pipelines matching "payments-*".`,
				`Pipeline "my-app" may use "go", "go-1-26";`,
				`ask a cluster operator to allow pipeline "my-app" in BuildEnvironment "payments"`,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w.t = t
			j := w.acceptJob()
			w.createBuildJob(j, gen.SetBuildJobEnvironment(tc.asked))
			bj := w.waitReported(j.name)
			assert.Equal(t, bkv1.PhaseFailed, bj.Status.Phase)
			assert.Equal(t, bkv1.ReasonEnvironmentNotFound, condition(bj, bkv1.ConditionFinished).Reason)
			snap, err := w.bk.WaitJob(w.ctx, j.id, func(s fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(s.State) })
			require.NoError(t, err)
			log := fakebuildkite.PlainLog(snap.Log)
			for _, want := range tc.want {
				assert.Contains(t, log, want)
				assert.Contains(t, bj.Status.Message, want)
			}
			assert.NotContains(t, log, "spec.")
			assert.NotContains(t, log, "kubectl")
		})
	}
	w.t = t
}

// startEnvironmentController runs the BuildEnvironment controller, watching only the
// world's namespace, until the test ends.
func (w *world) startEnvironmentController() {
	w.t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}},
	})
	require.NoError(w.t, err)
	require.NoError(w.t, buildenvironment.Setup(mgr, nil, controller.SetupOptions{SkipNameValidation: true}))
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	w.t.Cleanup(func() {
		cancel()
		require.NoError(w.t, <-done)
	})
}

func (w *world) waitReady(name string, what string, cond func(c *metav1.Condition, e *bkv1.BuildEnvironment) bool) *bkv1.BuildEnvironment {
	w.t.Helper()
	e := &bkv1.BuildEnvironment{}
	require.Eventually(w.t, func() bool {
		if err := w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: name}, e); err != nil {
			return false
		}
		c := meta.FindStatusCondition(e.Status.Conditions, bkv1.ConditionReady)
		return c != nil && cond(c, e)
	}, waitFor, tick, "BuildEnvironment %s: %s; conditions %+v", name, what, e.Status.Conditions)
	return e
}

// The BuildEnvironment controller sets Ready from the validation the webhook runs, so an
// environment admitted without the webhook (here: there is none) shows as not ready, with
// what is wrong, and as ready once fixed; kubectl's READY column shows it.
func TestBuildEnvironmentReady(t *testing.T) {
	w := newWorld(t, testOptions())
	// Made before the controller runs, as an environment that predates it would be.
	bad := gen.BuildEnvironment("privileged", gen.SetBuildEnvironmentNamespace(w.ns),
		func(e *bkv1.BuildEnvironment) {
			e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
			e.Spec.Env = []corev1.EnvVar{{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "buildkite-agent-token"}, Key: "token"}}}}
		})
	require.NoError(t, w.c.Create(w.ctx, bad))
	w.startEnvironmentController()

	good := w.waitReady(envName, "ready", func(c *metav1.Condition, e *bkv1.BuildEnvironment) bool {
		return c.Status == metav1.ConditionTrue
	})
	c := meta.FindStatusCondition(good.Status.Conditions, bkv1.ConditionReady)
	assert.Equal(t, bkv1.ReasonEnvironmentValid, c.Reason)
	assert.Equal(t, good.Generation, c.ObservedGeneration)
	assert.Equal(t, good.Generation, good.Status.ObservedGeneration)

	got := w.waitReady(bad.Name, "not ready", func(c *metav1.Condition, e *bkv1.BuildEnvironment) bool {
		return c.Status == metav1.ConditionFalse
	})
	c = meta.FindStatusCondition(got.Status.Conditions, bkv1.ConditionReady)
	assert.Equal(t, bkv1.ReasonEnvironmentInvalid, c.Reason)
	assert.Equal(t, `2 problems: spec.securityContext.privileged: Forbidden: a privileged container can reach the node and every pod on it; allow it with spec.allow.privileged: true. spec.env[0].valueFrom.secretKeyRef.name: Forbidden: Secret "buildkite-agent-token" is not in spec.allow.secrets; list it there to let jobs read it`, c.Message)

	out, err := exec.Command(env.Kubectl(), "--kubeconfig", env.KubeconfigPath, "get", "buildenvironments", "-n", w.ns,
		"-o", "custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type==\"Ready\")].status").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `(?m)^go\s+True$`, string(out))
	assert.Regexp(t, `(?m)^privileged\s+False$`, string(out))
	out, err = exec.Command(env.Kubectl(), "--kubeconfig", env.KubeconfigPath, "get", "buildenvironments", "-n", w.ns).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `(?m)^NAME\s+IMAGE\s+RUNNER\s+READY\s+AGE$`, string(out))
	assert.Regexp(t, `(?m)^privileged\s+golang:1.26\s+Bootstrap\s+False\s+`, string(out))

	// Fixed: ready again, for the new generation.
	got.Spec.Allow = bkv1.Allow{Privileged: true, Secrets: []string{"buildkite-agent-token"}}
	require.NoError(t, w.c.Update(w.ctx, got))
	w.waitReady(bad.Name, "ready once allowed", func(c *metav1.Condition, e *bkv1.BuildEnvironment) bool {
		return c.Status == metav1.ConditionTrue && c.ObservedGeneration == e.Generation && e.Status.ObservedGeneration == e.Generation
	})
}
