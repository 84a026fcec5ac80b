package spawner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// TestWithOnlyTheChartsRBAC runs the spawner as the chart's ServiceAccount (impersonated,
// with only the chart's Roles and ClusterRole, rendered for the test's two namespaces): jobs
// are accepted, their BuildJobs and token Secrets written in the job namespace and the slot
// state in the operator's, and the jobs finish, and a job whose options are invalid is failed
// at intake.
func TestWithOnlyTheChartsRBAC(t *testing.T) {
	ns := newNamespace(t)
	opNS := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 100*time.Millisecond)
	cfg := asChartServiceAccount(t, opNS, ns)
	cl, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	startSpawnerWith(t, fake, ns, cl, func(c *spawner.Config) {
		c.Namespace, c.JobNamespace = opNS, ns
		c.APIReader = cl
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ca, err := cache.New(cfg, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
		require.NoError(t, err)
		go func() { _ = ca.Start(ctx) }()
		c.Cache = ca
	})

	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(4, goPlugin)})
	require.NoError(t, err)
	bad, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1,
		"    plugins:\n      - buildkite-operator#v0.1.0:\n          build_environment: no-such-environment\n")})
	require.NoError(t, err)
	waitJobsFinished(t, fake, append(b.Jobs, bad.Jobs...), 90*time.Second)
	for _, id := range b.Jobs {
		j, _ := fake.Job(id)
		assert.Equal(t, "0", j.ExitStatus, "job %s; log:\n%s", id, j.Log)
		assert.Equal(t, 1, j.FinishCount)
	}
	j, _ := fake.Job(bad.Jobs[0])
	assert.Equal(t, "-1", j.ExitStatus, "the job naming a missing environment fails at intake")
	assert.Contains(t, string(j.Log), "no-such-environment")

	var slots, jobSecrets corev1.SecretList
	require.NoError(t, env.Client.List(context.Background(), &slots, client.InNamespace(opNS)))
	require.NoError(t, env.Client.List(context.Background(), &jobSecrets, client.InNamespace(ns)))
	for _, s := range slots.Items {
		assert.NotContains(t, s.Name, "token", "no job's Secret in the operator's namespace")
	}
	assert.NotEmpty(t, slots.Items, "the slots' state lives in the operator's namespace")
	assert.Len(t, jobSecrets.Items, 4, "one token Secret per accepted job, in the job namespace")
}

// asChartServiceAccount installs the chart's ServiceAccount and RBAC for a release in ns
// whose jobs run in jobNS, and returns a config that impersonates that ServiceAccount.
func asChartServiceAccount(t *testing.T, ns, jobNS string) *rest.Config {
	t.Helper()
	user, err := helmchart.ApplyServiceAccount(context.Background(), env.Client, ns, jobNS)
	require.NoError(t, err)
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}
