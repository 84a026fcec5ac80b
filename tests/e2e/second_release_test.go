package e2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/image"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// A release, published and installed, beside the suite's: TestSecondRelease cuts a release
// as `make release` does (image.Release: agentd built static, the operator image index, the
// chart pinned to it by digest) into a registry on this machine, and installs that chart
// from the registry as a user would (helm install oci://...), in its own namespace, with its
// own job namespace and queue, beside the suite's release: nothing cluster-scoped collides
// (webhooks and leader election on in both), its Deployment runs the published image by
// digest, and each operator takes only its own queue's jobs, into its own job namespace.
const (
	secondRelease      = "second"
	secondNamespace    = "bk-second"
	secondJobNamespace = "bk-second-jobs"
	secondQueue        = "bk-second"
	secondSlots        = 2
	secondVersion      = "0.0.0-e2e"
)

func TestSecondRelease(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Node, "the node must pull from the test's registry")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	// The registry listens on every interface, as one a node pulls from would; the release
	// and the node reach it over the loopback address.
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	host := fmt.Sprintf("127.0.0.1:%d", ln.Addr().(*net.TCPAddr).Port)
	require.NoError(t, e.Node.TrustPlainHTTPRegistry(host))

	t0 := time.Now()
	out := t.TempDir()
	res, err := image.Release(ctx, image.ReleaseOptions{
		Version: secondVersion, Registry: host + "/bko", Push: true, PlainHTTP: true,
		Root: testkit.RepoRoot(), BinDir: filepath.Join(out, "bin"), OutDir: filepath.Join(out, "release"),
		Helm: helmchart.HelmBinary(), Logf: t.Logf,
		// This node's platform only: image/release_test.go checks the two-platform index;
		// a cold arm64 build of agentd would add minutes to every CI run for no more proof.
		Platforms: []v1.Platform{{OS: "linux", Architecture: runtime.GOARCH}},
	})
	require.NoError(t, err)
	recordTiming("release: %s cut and pushed in %s", res.Image(), time.Since(t0).Round(10*time.Millisecond))
	chart := "oci://" + host + "/bko/charts/" + image.ChartName
	require.Equal(t, chart+" --version "+secondVersion, res.Chart(), "the chart is where the release said")

	require.NoError(t, e.CreateTokenSecret(ctx, secondNamespace))
	// The suite's values but the operator image, which the published chart pins by digest,
	// and the binaries: the suite's release takes image volumes where the node has them
	// (binariesFrom: auto), this one copies them in init containers, as on a cluster
	// without image volumes.
	values := append(e.ReleaseValues(secondJobNamespace, secondQueue, secondSlots), "--set", "binariesFrom=init-container")
	second, err := e.NewRelease(secondRelease, secondNamespace, values)
	require.NoError(t, err)
	second.Chart = []string{chart, "--version", secondVersion, "--plain-http"}
	t1 := time.Now()
	require.NoError(t, second.Install(ctx), "installing the published chart beside the suite's release")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		assert.NoError(t, second.Uninstall(ctx))
		for _, ns := range []string{secondNamespace, secondJobNamespace} {
			assert.NoError(t, client.IgnoreNotFound(e.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})))
		}
	})
	recordTiming("release: installed from %s beside the suite's in %s", chart, time.Since(t1).Round(10*time.Millisecond))
	var dep appsv1.Deployment
	require.NoError(t, e.Client.Get(ctx, client.ObjectKey{Namespace: secondNamespace, Name: second.FullName()}, &dep))
	for _, c := range dep.Spec.Template.Spec.Containers {
		assert.Equal(t, res.Image(), c.Image, "container %s runs the published image by digest", c.Name)
	}
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
  - command: echo "ran for queue ` + queue + ` with buildkite-agent from $BUILDKITE_BIN_PATH/"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: default
`,
		})
		require.NoError(t, err)
		ids[queue] = b.Jobs[0]
	}
	want := map[string]string{"bk-operator": e.JobNamespace, secondQueue: secondJobNamespace}
	// Where each job found buildkite-agent says how its pod got it (podcontract): the
	// suite's node runs containerd 2 (tests/cluster), which has image volumes.
	binPath := map[string]string{"bk-operator": podcontract.AgentImageDir, secondQueue: podcontract.BinDir}
	for queue, id := range ids {
		j, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
		require.NoError(t, err)
		log := fakebuildkite.PlainLog(j.Log)
		assert.Equal(t, "0", j.ExitStatus, "the job for queue %s; log:\n%s", queue, log)
		assert.Contains(t, log, "ran for queue "+queue+" with buildkite-agent from "+binPath[queue]+"/")
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
