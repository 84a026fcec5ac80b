package imagevolume

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

// node is a node reporting a kubelet and a container runtime version.
type node struct{ kubelet, runtime string }

func TestChooseAuto(t *testing.T) {
	ctx := context.Background()
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config)
	require.NoError(t, err)
	info, err := disco.ServerVersion()
	require.NoError(t, err)
	current := node{info.GitVersion, "containerd://2.1.4"}

	cases := []struct {
		name   string
		server string
		nodes  []node
		want   podbuilder.Binaries
		reason string
	}{
		{name: "this API server, nodes on containerd 2.1 and CRI-O 1.31", server: info.GitVersion,
			nodes: []node{current, {"v1.35.0", "cri-o://1.31.2"}, {"v1.36.1", "containerd://2.2.0-k3s1"}},
			want:  podbuilder.BinariesImageVolume, reason: "each of the 3 nodes"},
		{name: "an API server before 1.35", server: "v1.34.2", nodes: []node{current},
			want: podbuilder.BinariesInitContainer, reason: "the API server is v1.34.2, older than 1.35.0"},
		{name: "one node on containerd 1.7", server: info.GitVersion, nodes: []node{current, {"v1.35.1", "containerd://1.7.27"}},
			want: podbuilder.BinariesInitContainer, reason: "node n1's containerd is 1.7.27, older than 2.1.0"},
		{name: "the node on containerd 1.7 on the second page", server: info.GitVersion, nodes: []node{current, current, {"v1.35.1", "containerd://1.7.27"}},
			want: podbuilder.BinariesInitContainer, reason: "node n2's containerd is 1.7.27, older than 2.1.0"},
		{name: "one kubelet before 1.35", server: info.GitVersion, nodes: []node{{"v1.34.9", "containerd://2.1.4"}},
			want: podbuilder.BinariesInitContainer, reason: "the kubelet of node n0 is v1.34.9, older than 1.35.0"},
		{name: "CRI-O before 1.31", server: info.GitVersion, nodes: []node{{"v1.35.0", "cri-o://1.30.4"}},
			want: podbuilder.BinariesInitContainer, reason: "node n0's CRI-O is 1.30.4, older than 1.31.0"},
		{name: "a runtime the operator does not know", server: info.GitVersion, nodes: []node{{"v1.35.0", "kwok-v0.8.0"}},
			want: podbuilder.BinariesInitContainer, reason: `container runtime "kwok-v0.8.0"`},
		{name: "a kubelet version that is none", server: info.GitVersion, nodes: []node{{"fake", "containerd://2.1.4"}},
			want: podbuilder.BinariesInitContainer, reason: `reports version "fake"`},
		{name: "no nodes", server: info.GitVersion,
			want: podbuilder.BinariesInitContainer, reason: "no nodes yet"},
	}
	// Two nodes a page, so that the three-node cases read more than one.
	defer func(n int64) { nodePage = n }(nodePage)
	nodePage = 2
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			setNodes(t, tc.nodes)
			d, err := Choose(ctx, Auto, cluster(t, env, tc.server))
			require.NoError(t, err)
			assert.Equal(t, tc.want, d.Binaries)
			assert.Contains(t, d.Reason, tc.reason)
		})
	}
}

func TestChooseNodesForbidden(t *testing.T) {
	setNodes(t, []node{{"v1.35.0", "containerd://2.1.4"}})
	cl := cluster(t, env, "v1.35.4")
	cl.Nodes = noRights(t)
	d, err := Choose(context.Background(), Auto, cl)
	require.NoError(t, err)
	assert.Equal(t, podbuilder.BinariesInitContainer, d.Binaries)
	assert.Contains(t, d.Reason, "may not list nodes")
}

func TestChooseExplicit(t *testing.T) {
	// Told which, the operator asks nothing: a nil reader would panic if it did.
	for _, m := range []Mode{Mode(podbuilder.BinariesImageVolume), Mode(podbuilder.BinariesInitContainer)} {
		d, err := Choose(context.Background(), m, Cluster{ServerVersion: "v1.20.0"})
		require.NoError(t, err)
		assert.Equal(t, podbuilder.Binaries(m), d.Binaries)
	}
}

func TestModeFlag(t *testing.T) {
	var m Mode
	for _, v := range []string{"auto", "image-volume", "init-container"} {
		require.NoError(t, m.Set(v))
		assert.Equal(t, v, m.String())
	}
	assert.EqualError(t, m.Set("volume"), `"volume": use auto, image-volume or init-container`)
}

// TestChoosePodRefused: an API server of the right version, with nodes that have image
// volumes, that does not take a pod with one gets the copy, saying why: its ImageVolume
// feature gate turned off, or the operator refused the pod for another reason.
func TestChoosePodRefused(t *testing.T) {
	gateOff, err := testenv.Start(func(e *envtest.Environment) {
		e.ControlPlane.GetAPIServer().Configure().Append("feature-gates", "ImageVolume=false")
	})
	require.NoError(t, err)
	defer func() { require.NoError(t, gateOff.Stop()) }()
	setNodesOn(t, gateOff, []node{{"v1.35.0", "containerd://2.1.4"}})
	d, err := Choose(context.Background(), Auto, cluster(t, gateOff, "v1.35.4"))
	require.NoError(t, err)
	assert.Equal(t, podbuilder.BinariesInitContainer, d.Binaries)
	assert.Contains(t, d.Reason, "dropped the image volume of a pod tried in namespace")
	assert.Contains(t, d.Reason, "as it does with the ImageVolume feature gate off")

	// Allowed to list nodes, not to create pods: refused, for another reason.
	setNodes(t, []node{{"v1.35.0", "containerd://2.1.4"}})
	cl := cluster(t, env, "v1.35.4")
	cl.Pods = noRights(t)
	d, err = Choose(context.Background(), Auto, cl)
	require.NoError(t, err)
	assert.Equal(t, podbuilder.BinariesInitContainer, d.Binaries)
	assert.Contains(t, d.Reason, "refused a pod with an image volume in namespace "+cl.Namespace)
	assert.NotContains(t, d.Reason, "feature gate")
	var pods corev1.PodList
	require.NoError(t, env.Client.List(context.Background(), &pods, client.InNamespace(cl.Namespace)))
	assert.Empty(t, pods.Items, "the pod was a dry run")
}

// noRights is a client of the test API server as a user no role binds.
func noRights(t *testing.T) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "no-rights"}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	return c
}

// cluster is e's API server as Choose asks it, claiming serverVersion, with a job
// namespace of its own.
func cluster(t *testing.T, e *testenv.Env, serverVersion string) Cluster {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "jobs-"}}
	require.NoError(t, e.Client.Create(context.Background(), ns))
	return Cluster{ServerVersion: serverVersion, Nodes: e.Client, Pods: e.Client, Namespace: ns.Name, Image: "bk-operator/agentd:dev"}
}

// setNodes replaces the API server's nodes with nodes, named n0, n1, ...
func setNodes(t *testing.T, nodes []node) { setNodesOn(t, env, nodes) }

// setNodesOn replaces e's nodes with nodes, named n0, n1, ...
func setNodesOn(t *testing.T, e *testenv.Env, nodes []node) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.Client.DeleteAllOf(ctx, &corev1.Node{}))
	for i, n := range nodes {
		obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n" + string(rune('0'+i))}}
		require.NoError(t, e.Client.Create(ctx, obj))
		obj.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: n.kubelet, ContainerRuntimeVersion: n.runtime}
		require.NoError(t, e.Client.Status().Update(ctx, obj))
	}
}
