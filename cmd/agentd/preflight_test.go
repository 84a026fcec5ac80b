package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
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
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

func TestPreflightFlags(t *testing.T) {
	var c operatorConfig
	require.NoError(t, flagenv.ParseEnv(c.flags(), nil, noEnv))
	assert.Equal(t, preflightConfig{endpoint: "https://api.buildkite.com/"}, c.preflight, "no token: nothing is checked")
	require.NoError(t, c.preflight.check())

	c = operatorConfig{}
	require.NoError(t, flagenv.ParseEnv(c.flags(), []string{"--buildkite-cluster=gke-prod"}, func(k string) string {
		return map[string]string{
			"BK_OPERATOR_BUILDKITE_API_TOKEN_FILE": "/etc/bk/token",
			"BK_OPERATOR_BUILDKITE_ORGANIZATION":   "acme",
			"BK_OPERATOR_BUILDKITE_CLUSTER":        "eks",
			"BK_OPERATOR_BUILDKITE_API_ENDPOINT":   "http://fake:8080/",
		}[k]
	}))
	assert.Equal(t, preflightConfig{tokenFile: "/etc/bk/token", organization: "acme", cluster: "gke-prod", endpoint: "http://fake:8080/"}, c.preflight)

	for _, tc := range []struct{ args []string }{
		{[]string{"--buildkite-api-endpoint=api.buildkite.com"}},
		{[]string{"--buildkite-api-endpoint=https://user@api.buildkite.com/"}},
		{[]string{"--buildkite-organization=acme/clusters"}},
		{[]string{"--buildkite-organization=https://buildkite.com/acme"}},
	} {
		c = operatorConfig{}
		require.NoError(t, flagenv.ParseEnv(c.flags(), tc.args, noEnv))
		err := c.preflight.check()
		require.Error(t, err, tc.args)
		assert.Contains(t, err.Error(), strings.SplitN(tc.args[0], "=", 2)[0], "the error names the flag")
	}
}

// The start-up check records what it found as events on the operator's Pod, where
// `kubectl describe pod` shows them (client-go's SearchWithContext selects as describe does: on the
// Pod's name, namespace, kind and UID), and logs it; the token is in neither.
func TestPreflightEvents(t *testing.T) {
	env, err := testenv.Start()
	require.NoError(t, err)
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)

	const token = "bkua_secret-api-token-0123456789abcdef"
	fake := fakebuildkite.StartForTest(t, fakebuildkite.Options{})
	rest := fake.REST()
	rest.AddToken(fakebuildkite.APIToken{Token: token, Scopes: []string{fakebuildkite.ScopeReadClusters}, Organizations: []string{"acme"}})
	rest.AddCluster("acme", "gke-prod")
	_, err = rest.AddQueue("acme", "gke-prod", "bk-operator")
	require.NoError(t, err)
	_, err = rest.AddQueue("acme", "gke-prod", "paused")
	require.NoError(t, err)
	require.NoError(t, rest.PauseQueue("acme", "gke-prod", "paused", "maintenance"))

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	badFile := filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(badFile, []byte("bkua_revoked"), 0o600))

	cases := []struct {
		name                 string
		config               preflightConfig
		queue                string
		wantType, wantReason string
		wantMessage          []string
	}{
		{
			name: "no token", config: preflightConfig{}, queue: "bk-operator",
			wantType: corev1.EventTypeNormal, wantReason: preflight.ReasonSkipped,
			wantMessage: []string{"no Buildkite API token (--buildkite-api-token-file)", "not checked", "read_clusters"},
		},
		{
			name: "all good", config: preflightConfig{tokenFile: tokenFile, organization: "acme", cluster: "gke-prod"}, queue: "bk-operator",
			wantType: corev1.EventTypeNormal, wantReason: preflight.ReasonPassed,
			wantMessage: []string{`queue "bk-operator" exists in cluster "gke-prod"`},
		},
		{
			name: "queue paused", config: preflightConfig{tokenFile: tokenFile, organization: "acme", cluster: "gke-prod"}, queue: "paused",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonQueuePaused,
			wantMessage: []string{`dispatch is paused on queue "paused" of cluster "gke-prod"`, `note "maintenance"`, "resume"},
		},
		{
			name: "queue missing", config: preflightConfig{tokenFile: tokenFile, organization: "acme", cluster: "gke-prod"}, queue: "nope",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonQueueNotFound,
			wantMessage: []string{`has no queue "nope"`, "Create it"},
		},
		{
			name: "token rejected", config: preflightConfig{tokenFile: badFile, organization: "acme", cluster: "gke-prod"}, queue: "bk-operator",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonTokenRejected,
			wantMessage: []string{"401", "with the read_clusters scope and access to organization acme"},
		},
		{
			name: "token file missing", config: preflightConfig{tokenFile: filepath.Join(dir, "absent"), organization: "acme"}, queue: "bk-operator",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonTokenUnreadable,
			wantMessage: []string{"reading the Buildkite API token file", "absent"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "preflight-"}}
			require.NoError(t, env.Client.Create(ctx, ns))
			pod := operatorPod(t, ctx, env, ns.Name)

			var mu sync.Mutex
			var logs strings.Builder
			log := funcr.New(func(prefix, args string) {
				mu.Lock()
				defer mu.Unlock()
				logs.WriteString(prefix + " " + args + "\n")
			}, funcr.Options{})
			tc.config.endpoint = fake.RESTEndpoint()
			run := &preflightRun{
				config: tc.config, queue: tc.queue, userAgent: "agentd-test", log: log, timeout: 20 * time.Second,
				events: &podEvents{client: env.Client, pod: podReference(func(k string) string {
					return map[string]string{envPodName: pod.Name, envPodNamespace: pod.Namespace, envPodUID: string(pod.UID)}[k]
				}, "unused")},
			}
			require.NoError(t, run.Start(ctx))

			events, err := cs.CoreV1().Events(ns.Name).SearchWithContext(ctx, scheme.Scheme, pod)
			require.NoError(t, err)
			require.Len(t, events.Items, 1, "one event, once: %+v", events.Items)
			ev := events.Items[0]
			assert.Equal(t, tc.wantType, ev.Type)
			assert.Equal(t, tc.wantReason, ev.Reason)
			for _, s := range tc.wantMessage {
				assert.Contains(t, ev.Message, s)
			}
			assert.Equal(t, "buildkite-operator", ev.Source.Component)
			mu.Lock()
			out := logs.String()
			mu.Unlock()
			assert.Contains(t, out, tc.wantReason, "the log says it too")
			assert.Contains(t, out, "Buildkite start-up check: ")
			assert.NotContains(t, ev.Message, token)
			assert.NotContains(t, out, token, "never log the token")
			assert.NotContains(t, out, "bkua_revoked", "nor a token Buildkite refused")
		})
	}

	// Without POD_NAME there is no Pod to record on: the log says so, and the check still runs.
	var logs strings.Builder
	run := &preflightRun{queue: "bk-operator", events: &podEvents{client: env.Client, pod: podReference(noEnv, "buildkite")},
		log: funcr.New(func(prefix, args string) { logs.WriteString(args + "\n") }, funcr.Options{})}
	require.NoError(t, run.Start(ctx))
	assert.Contains(t, logs.String(), preflight.ReasonSkipped)
	assert.Contains(t, logs.String(), "POD_NAME is not set")

	t.Run("on a replica without the Lease", func(t *testing.T) { testPreflightWithoutTheLease(t, ctx, env, cs) })
}

// `agentd operator` runs the check on every replica: a replica that is not the leader
// (another holds the Lease) records its event all the same, and the spawner being off
// turns the check off.
func testPreflightWithoutTheLease(t *testing.T, ctx context.Context, env *testenv.Env, cs kubernetes.Interface) {
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

	t.Setenv(envPodName, pod.Name)
	t.Setenv(envPodNamespace, pod.Namespace)
	t.Setenv(envPodUID, string(pod.UID))
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
	c.preflight.endpoint = "api.buildkite.com"
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
