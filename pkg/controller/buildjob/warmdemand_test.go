package buildjob_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/warmdemand"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestWarmPoolFollowsDemand: a pool of size 1 and maxSize 4 keeps as many idle pods as
// jobs wait on the operator's queue, read from the fake Buildkite's REST API with an API
// token, within its size and maxSize, and says so in its status; once the jobs are gone it
// is back to its size.
func TestWarmPoolFollowsDemand(t *testing.T) {
	w := prepareWorld(t)
	const apiToken = "bkua_warm-demand-test"
	w.bk.REST().AddOrganization("org")
	w.bk.REST().AddToken(fakebuildkite.APIToken{Token: apiToken, Scopes: []string{warmdemand.ScopeReadBuilds}, Organizations: []string{"org"}})
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(apiToken), 0o600))
	demand, err := warmdemand.New(warmdemand.Config{
		TokenFile: tokenFile, Endpoint: w.bk.RESTEndpoint(), Organization: "org", Queue: "bk-operator",
		Interval: 200 * time.Millisecond, ShrinkDelay: -1,
	})
	require.NoError(t, err)

	reg := handoff.NewRegistry()
	reg.MarkReady()
	opts := warmOptions(w, reg, "buildkite-operator."+w.ns+".handoff")
	copts := cache.Options{DefaultNamespaces: map[string]cache.Config{w.ns: {}}}
	buildjob.ConfigureCache(&copts)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0", Cache: copts,
	})
	require.NoError(t, err)
	require.NoError(t, buildjob.Setup(mgr, opts, controller.SetupOptions{SkipNameValidation: true}))
	warm := &buildenvironment.WarmPools{Pod: opts.PodOptions(), Registry: reg, Demand: demand}
	require.NoError(t, buildenvironment.Setup(mgr, warm, controller.SetupOptions{SkipNameValidation: true}))
	require.NoError(t, mgr.Add(demand))
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	maxSize := int32(4)
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		e := w.environment()
		e.Spec.WarmPool = &bkv1.WarmPool{Size: 1, MaxSize: &maxSize}
		return w.c.Update(w.ctx, e)
	}))

	w.waitIdleWarmPods(map[string]int{envName: 1})
	w.waitPoolMessage(envName, `0 jobs wait for an agent on queue "bk-operator": the pool keeps 1 idle pod (its size is 1, its maxSize 4)`)

	wave, err := w.bk.CreateBuild(fakebuildkite.BuildRequest{PipelineYAML: "steps:\n  - command: a\n    parallelism: 3\n    agents: {queue: bk-operator}\n"})
	require.NoError(t, err)
	w.waitIdleWarmPods(map[string]int{envName: 3})
	w.waitPoolMessage(envName, `3 jobs wait for an agent on queue "bk-operator": the pool keeps 3 idle pods (its size is 1, its maxSize 4)`)
	e := &bkv1.BuildEnvironment{}
	require.NoError(t, w.c.Get(w.ctx, types.NamespacedName{Namespace: w.ns, Name: envName}, e))
	require.Equal(t, int32(3), e.Status.WarmPool.Size)

	more, err := w.bk.CreateBuild(fakebuildkite.BuildRequest{PipelineYAML: "steps:\n  - command: b\n    parallelism: 3\n    agents: {queue: bk-operator}\n"})
	require.NoError(t, err)
	w.waitIdleWarmPods(map[string]int{envName: 4})
	w.waitPoolMessage(envName, `6 jobs wait for an agent on queue "bk-operator": the pool keeps 4 idle pods (its size is 1, its maxSize 4)`)

	for _, id := range append(wave.Jobs, more.Jobs...) {
		require.NoError(t, w.bk.CancelJob(id))
	}
	w.waitIdleWarmPods(map[string]int{envName: 1})
	w.waitPoolMessage(envName, `0 jobs wait for an agent on queue "bk-operator": the pool keeps 1 idle pod`)
}
