package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
	"github.com/buildkite-operator/buildkite-operator/pkg/startupcheck"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// `agentd operator` runs the start-up check on every replica: a replica that is not the
// leader (another holds the Lease) records its event all the same, and the spawner being
// off turns the check off. pkg/startupcheck's tests have what the check finds and records.
func TestPreflightWithoutTheLease(t *testing.T) {
	env, err := testenv.Start()
	require.NoError(t, err)
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "preflight-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	pod := operatorPod(t, ctx, env, ns.Name)
	now := metav1.NewMicroTime(time.Now())
	require.NoError(t, env.Client.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "preflight-test", Namespace: ns.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another-replica"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now},
	}))

	fake := fakebuildkite.StartForTest(t, fakebuildkite.Options{})
	fake.REST().AddToken(fakebuildkite.APIToken{Token: "tok", Scopes: []string{fakebuildkite.ScopeReadClusters}, Organizations: []string{"acme"}})
	fake.REST().AddCluster("acme", "gke-prod")
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("tok"), 0o600))

	t.Setenv(startupcheck.EnvPodName, pod.Name)
	t.Setenv(startupcheck.EnvPodNamespace, pod.Namespace)
	t.Setenv(startupcheck.EnvPodUID, string(pod.UID))
	var c operatorConfig
	require.NoError(t, flagenv.ParseEnv(c.flags(), []string{
		"--namespace=" + ns.Name, "--leader-elect=true", "--leader-election-id=preflight-test",
		"--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--buildkite-api-token-file=" + tokenFile, "--buildkite-organization=acme", "--buildkite-cluster=gke-prod",
		"--buildkite-api-endpoint=" + fake.RESTEndpoint(),
	}, noEnv))
	mgr, err := c.manager.newManager(env.KubeconfigPath)
	require.NoError(t, err)
	require.NoError(t, addPreflight(mgr, &c))
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() { stop(); <-done }()

	var ev corev1.Event
	require.Eventually(t, func() bool {
		events, err := cs.CoreV1().Events(ns.Name).SearchWithContext(ctx, scheme.Scheme, pod)
		if err != nil || len(events.Items) == 0 {
			return false
		}
		ev = events.Items[0]
		return true
	}, time.Minute, 100*time.Millisecond, "no event on the Pod")
	assert.Equal(t, corev1.EventTypeWarning, ev.Type)
	assert.Equal(t, preflight.ReasonQueueNotFound, ev.Reason, "the default queue, bk-operator, is not in the cluster")
	assert.Contains(t, ev.Message, `has no queue "bk-operator"`)
	select {
	case <-mgr.Elected():
		t.Fatal("the manager took a Lease another replica holds")
	default:
	}

	// A bad endpoint is refused when the check is added, not met at run time; with the
	// spawner off nothing registers with Buildkite, so nothing is checked, nor refused.
	mgr2, err := c.manager.newManager(env.KubeconfigPath)
	require.NoError(t, err)
	c.preflight.Endpoint = "api.buildkite.com"
	err = addPreflight(mgr2, &c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--buildkite-api-endpoint")
	c.spawnerEnabled = false
	require.NoError(t, addPreflight(mgr2, &c))
}

// operatorPod makes a Pod standing for the operator's (envtest schedules and runs nothing).
func operatorPod(t *testing.T, ctx context.Context, env *testenv.Env, namespace string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "operator-0", Namespace: namespace},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "operator", Image: "agentd"}}},
	}
	require.NoError(t, env.Client.Create(ctx, pod))
	require.NotEmpty(t, pod.UID)
	return pod
}
