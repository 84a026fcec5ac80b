package startupcheck

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// flags binds the check's flags alone, as `agentd operator` binds them among its own.
func flags(c *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("agentd operator", flag.ContinueOnError)
	c.BindFlags(fs)
	return fs
}

func noEnv(string) string { return "" }

func TestPreflightFlags(t *testing.T) {
	var c Config
	require.NoError(t, flagenv.ParseEnv(flags(&c), nil, noEnv))
	assert.Equal(t, Config{Endpoint: "https://api.buildkite.com/"}, c, "no token: nothing is checked")
	require.NoError(t, c.Validate())

	c = Config{}
	require.NoError(t, flagenv.ParseEnv(flags(&c), []string{"--buildkite-cluster=gke-prod"}, func(k string) string {
		return map[string]string{
			"BK_OPERATOR_BUILDKITE_API_TOKEN_FILE": "/etc/bk/token",
			"BK_OPERATOR_BUILDKITE_ORGANIZATION":   "acme",
			"BK_OPERATOR_BUILDKITE_CLUSTER":        "eks",
			"BK_OPERATOR_BUILDKITE_API_ENDPOINT":   "http://fake:8080/",
		}[k]
	}))
	assert.Equal(t, Config{TokenFile: "/etc/bk/token", Organization: "acme", Cluster: "gke-prod", Endpoint: "http://fake:8080/"}, c)

	for _, tc := range []struct{ args []string }{
		{[]string{"--buildkite-api-endpoint=api.buildkite.com"}},
		{[]string{"--buildkite-api-endpoint=https://user@api.buildkite.com/"}},
		{[]string{"--buildkite-organization=acme/clusters"}},
		{[]string{"--buildkite-organization=https://buildkite.com/acme"}},
	} {
		c = Config{}
		require.NoError(t, flagenv.ParseEnv(flags(&c), tc.args, noEnv))
		err := c.Validate()
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
		config               Config
		queue                string
		wantType, wantReason string
		wantMessage          []string
	}{
		{
			name: "no token", config: Config{}, queue: "bk-operator",
			wantType: corev1.EventTypeNormal, wantReason: preflight.ReasonSkipped,
			wantMessage: []string{"no Buildkite API token (--buildkite-api-token-file)", "not checked", "read_clusters"},
		},
		{
			name: "all good", config: Config{TokenFile: tokenFile, Organization: "acme", Cluster: "gke-prod"}, queue: "bk-operator",
			wantType: corev1.EventTypeNormal, wantReason: preflight.ReasonPassed,
			wantMessage: []string{`queue "bk-operator" exists in cluster "gke-prod"`},
		},
		{
			name: "queue paused", config: Config{TokenFile: tokenFile, Organization: "acme", Cluster: "gke-prod"}, queue: "paused",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonQueuePaused,
			wantMessage: []string{`dispatch is paused on queue "paused" of cluster "gke-prod"`, `note "maintenance"`, "resume"},
		},
		{
			name: "queue missing", config: Config{TokenFile: tokenFile, Organization: "acme", Cluster: "gke-prod"}, queue: "nope",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonQueueNotFound,
			wantMessage: []string{`has no queue "nope"`, "Create it"},
		},
		{
			name: "token rejected", config: Config{TokenFile: badFile, Organization: "acme", Cluster: "gke-prod"}, queue: "bk-operator",
			wantType: corev1.EventTypeWarning, wantReason: preflight.ReasonTokenRejected,
			wantMessage: []string{"401", "with the read_clusters scope and access to organization acme"},
		},
		{
			name: "token file missing", config: Config{TokenFile: filepath.Join(dir, "absent"), Organization: "acme"}, queue: "bk-operator",
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
			tc.config.Endpoint = fake.RESTEndpoint()
			run := &Check{
				Config: tc.config, Queue: tc.queue, UserAgent: "agentd-test", Log: log, Timeout: 20 * time.Second,
				Events: &PodEvents{Client: env.Client, Pod: PodReference(func(k string) string {
					return map[string]string{EnvPodName: pod.Name, EnvPodNamespace: pod.Namespace, EnvPodUID: string(pod.UID)}[k]
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
	run := &Check{Queue: "bk-operator", Events: &PodEvents{Client: env.Client, Pod: PodReference(noEnv, "buildkite")},
		Log: funcr.New(func(prefix, args string) { logs.WriteString(args + "\n") }, funcr.Options{})}
	require.NoError(t, run.Start(ctx))
	assert.Contains(t, logs.String(), preflight.ReasonSkipped)
	assert.Contains(t, logs.String(), "POD_NAME is not set")
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
