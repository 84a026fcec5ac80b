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

// TestResumeWithOnlyTheChartsRBAC restarts the spawner, as the chart's ServiceAccount and
// with the operator's and the job namespace apart, while its job runs: the resumed slot finds
// the BuildJob and its token in the job namespace and its own state in the operator's, and
// the job finishes once. (The resume once looked for the BuildJob in the operator's
// namespace, did not find it, and accepted the job again.)
func TestResumeWithOnlyTheChartsRBAC(t *testing.T) {
	ns := newNamespace(t)
	opNS := newNamespace(t)
	fake := startFake(t)
	cfg := asChartServiceAccount(t, opNS, ns)
	cl, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	asChart := func(c *spawner.Config) {
		c.Slots = 1
		c.Namespace, c.JobNamespace = opNS, ns
		c.APIReader = cl
	}
	first := startSpawnerWith(t, fake, ns, cl, asChart)
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	waitBuildJob(t, fake, ns, b.Jobs[0])
	first.stop()

	restarted := time.Now()
	startSpawnerWith(t, fake, ns, cl, asChart)
	j, _ := fake.Job(b.Jobs[0])
	waitFor(t, fake, 20*time.Second, "a heartbeat of the resumed slot", func() bool {
		for _, r := range fake.Requests() {
			if r.Endpoint == fakebuildkite.EPHeartbeat && r.AgentID == j.AcceptedBy && r.Time.After(restarted) {
				return true
			}
		}
		return false
	})
	startReporter(t, ns, 0)
	waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
	j, _ = fake.Job(b.Jobs[0])
	assert.Equal(t, 1, j.FinishCount)
	for _, r := range fake.Requests() {
		if r.Endpoint == fakebuildkite.EPAccept && r.Time.After(restarted) {
			t.Errorf("the resumed slot accepted its job again (%s): it did not find the job's BuildJob and token", r.Path)
		}
	}
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
