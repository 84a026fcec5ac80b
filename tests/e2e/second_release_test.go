package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// Two operators share the cluster: a second release of the chart, in its own namespace,
// with its own job namespace and queue, installs beside the suite's (nothing cluster-scoped
// collides, webhooks and leader election on in both), and each takes only its own queue's
// jobs, into its own job namespace.
const (
	secondRelease      = "second"
	secondNamespace    = "bk-second"
	secondJobNamespace = "bk-second-jobs"
	secondQueue        = "bk-second"
	secondSlots        = 2
)

func TestSecondRelease(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	require.NoError(t, e.CreateTokenSecret(ctx, secondNamespace))
	second, err := e.NewRelease(secondRelease, secondNamespace, e.ReleaseValues(secondJobNamespace, secondQueue, secondSlots))
	require.NoError(t, err)
	t0 := time.Now()
	require.NoError(t, second.Install(ctx), "installing a second release beside the suite's")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		assert.NoError(t, second.Uninstall(ctx))
		for _, ns := range []string{secondNamespace, secondJobNamespace} {
			assert.NoError(t, client.IgnoreNotFound(e.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})))
		}
	})
	recordTiming("second release installed in %s", time.Since(t0).Round(10*time.Millisecond))
	require.NoError(t, e.Fake.WaitFor(ctx, func() bool { return e.Fake.ConnectedAgents() >= spawn+secondSlots }),
		"the second release's agents did not connect beside the suite's")

	// Nothing cluster-scoped is shared: each kind's names of one release are not the other's.
	for _, list := range []func() client.ObjectList{
		func() client.ObjectList { return &rbacv1.ClusterRoleList{} },
		func() client.ObjectList { return &rbacv1.ClusterRoleBindingList{} },
		func() client.ObjectList { return &admissionregistrationv1.ValidatingWebhookConfigurationList{} },
		func() client.ObjectList { return &admissionregistrationv1.MutatingWebhookConfigurationList{} },
	} {
		first, other := releaseNames(ctx, t, e, list(), harness.ReleaseName), releaseNames(ctx, t, e, list(), secondRelease)
		require.NotEmpty(t, other, "%T of the second release", list())
		for name := range other {
			assert.NotContains(t, first, name, "%T %s belongs to both releases", list(), name)
		}
	}

	require.NoError(t, e.Client.Create(ctx, gen.BuildEnvironment("default",
		gen.SetBuildEnvironmentNamespace(secondJobNamespace),
		gen.SetBuildEnvironmentImage(e.Opts.JobImage), gen.SetBuildEnvironmentImagePullPolicy(e.Opts.JobImagePullPolicy),
		gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand))))

	// One job per queue, at once: each runs in its own operator's job namespace.
	ids := map[string]string{}
	for _, queue := range []string{"bk-operator", secondQueue} {
		b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
			Pipeline: "e2e-two-operators",
			PipelineYAML: `agents:
  queue: ` + queue + `
steps:
  - command: echo "ran for queue ` + queue + `"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: default
`,
		})
		require.NoError(t, err)
		ids[queue] = b.Jobs[0]
	}
	want := map[string]string{"bk-operator": e.JobNamespace, secondQueue: secondJobNamespace}
	for queue, id := range ids {
		j, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
		require.NoError(t, err)
		log := fakebuildkite.PlainLog(j.Log)
		assert.Equal(t, "0", j.ExitStatus, "the job for queue %s; log:\n%s", queue, log)
		assert.Contains(t, log, "ran for queue "+queue)
		for _, ns := range []string{e.JobNamespace, secondJobNamespace} {
			var list bkv1.BuildJobList
			require.NoError(t, e.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{bkv1.LabelJob: id}))
			if ns == want[queue] {
				assert.Len(t, list.Items, 1, "the job for queue %s has its BuildJob in %s", queue, ns)
			} else {
				assert.Empty(t, list.Items, "the job for queue %s has a BuildJob in the other operator's %s", queue, ns)
			}
		}
	}
}

// releaseNames are the names of list's objects that belong to release.
func releaseNames(ctx context.Context, t *testing.T, e *harness.Env, list client.ObjectList, release string) map[string]bool {
	t.Helper()
	require.NoError(t, e.Client.List(ctx, list, client.MatchingLabels{"app.kubernetes.io/instance": release}))
	items, err := meta.ExtractList(list)
	require.NoError(t, err)
	names := map[string]bool{}
	for _, o := range items {
		obj, err := meta.Accessor(o)
		require.NoError(t, err)
		names[obj.GetName()] = true
	}
	return names
}
