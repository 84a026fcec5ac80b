package spawner_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestJobEnvKeptInSecret runs a step whose env holds a password through the spawner and
// the pod builder, and creates the pod on the API server. Whoever may read BuildJobs or
// pods must not find the value there; the job's container must still get it, from the
// BuildJob's Secret, as the kubelet resolves a secretKeyRef.
func TestJobEnvKeptInSecret(t *testing.T) {
	const password = "hunter2"
	ctx := context.Background()
	ns := newNamespace(t)
	fake := startFake(t)
	startSpawner(t, fake, ns, oneSlot)
	yaml := "steps:\n  - command: make test\n    agents: {queue: bk-operator}\n    env: {DB_PASSWORD: " + password + ", FOO: bar}\n" + goPlugin
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: yaml})
	require.NoError(t, err)
	bj := waitBuildJob(t, fake, ns, b.Jobs[0])

	raw, err := json.Marshal(bj)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), password, "the BuildJob shows the step's secret")
	assert.Contains(t, bj.Spec.EnvNames, "DB_PASSWORD")
	assert.Contains(t, bj.Spec.EnvNames, "FOO")
	assert.Empty(t, bj.Spec.Env, "no value in clear")

	var be v1alpha1.BuildEnvironment
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: bj.Spec.BuildEnvironment}, &be))
	pod, err := podbuilder.Build(&bj, &be, podbuilder.Options{})
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(ctx, pod))
	t.Cleanup(func() {
		pod.Finalizers = nil
		_ = env.Client.Update(context.Background(), pod)
	})
	var stored corev1.Pod
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &stored))
	raw, err = json.Marshal(&stored)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), password, "the pod shows the step's secret")

	got := resolveEnv(t, ns, stored.Spec.Containers[0])
	assert.Equal(t, password, got["DB_PASSWORD"])
	assert.Equal(t, "bar", got["FOO"])
	assert.Equal(t, "app", got["BUILDKITE_PIPELINE_SLUG"], "Buildkite's own env goes the same way")
	assert.NotContains(t, got, "BUILDKITE_AGENT_TOKEN")
}

// resolveEnv is the environment the kubelet gives container c: plain values expanded as
// the kubelet expands them, and secretKeyRefs read from the Secrets of ns. It fails the test on a reference to a
// missing Secret or key, as the kubelet would refuse to start the container.
func resolveEnv(t *testing.T, ns string, c corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	secrets := map[string]*corev1.Secret{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = podcontract.Expand(e.Value, out)
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			sec := secrets[ref.Name]
			if sec == nil {
				sec = &corev1.Secret{}
				require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: ref.Name}, sec))
				secrets[ref.Name] = sec
			}
			v, ok := sec.Data[ref.Key]
			require.True(t, ok, "env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			out[e.Name] = string(v)
		}
	}
	return out
}

// TestJobEnvSecretOnResume makes sure an adopted BuildJob whose Secret was never made
// (the spawner died in between) gets the env in the Secret made on resume.
func TestJobEnvSecretOnResume(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	fake := startFake(t)
	yaml := "steps:\n  - command: make test\n    agents: {queue: bk-operator}\n    env: {DB_PASSWORD: hunter2}\n" + goPlugin
	bj, _ := oneJobThenStop(t, fake, ns, yaml)

	// As if the spawner had died after creating the BuildJob: no Secret, nothing recorded.
	sec := &corev1.Secret{}
	sec.Name, sec.Namespace = bj.Spec.TokenSecretRef.Name, ns
	require.NoError(t, env.Client.Delete(ctx, sec))

	startSpawner(t, fake, ns, oneSlot)
	require.Eventually(t, func() bool {
		return env.Client.Get(ctx, client.ObjectKeyFromObject(sec), sec) == nil
	}, 20*time.Second, 50*time.Millisecond, "the Secret made again")
	assert.Equal(t, "hunter2", string(sec.Data[v1alpha1.EnvSecretKey("DB_PASSWORD")]))
	assert.NotEmpty(t, sec.Data[bj.Spec.TokenSecretRef.Key], "the job token")
}
