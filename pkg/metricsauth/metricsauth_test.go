package metricsauth_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/buildkite-operator/buildkite-operator/pkg/metricsauth"
	"github.com/buildkite-operator/buildkite-operator/tests/scrape"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

// TestOnlyAllowedScrapersReadMetrics serves metrics as agentd does with --metrics-secure
// (controller-runtime's metrics server over HTTPS, with this package's filter) against a
// real API server, and scrapes it as a ServiceAccount that may read /metrics, as one that
// may not, and without a valid token.
func TestOnlyAllowedScrapersReadMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)

	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	token := func(name string) string {
		_, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		tr, err := cs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	scraper, stranger := token("scraper"), token("stranger")
	role, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-reader-"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-reader-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns.Name, Name: "scraper"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	addr := serveMetrics(ctx, t, env.Config)
	get := func(method, path, token string) (int, string, error) {
		return scrape.Do(ctx, method, "https://"+addr+path, token)
	}

	// The server takes a moment to listen, and the binding to reach the API server's
	// authorizer.
	require.Eventually(t, func() bool {
		code, _, err := get(http.MethodGet, "/metrics", scraper)
		return err == nil && code == http.StatusOK
	}, 30*time.Second, 200*time.Millisecond, "the scraper ServiceAccount, bound to a role that may get /metrics, was never let in")

	for _, tc := range []struct {
		name, method, path, token string
		code                      int
		says                      string
	}{
		{name: "allowed scraper", method: http.MethodGet, path: "/metrics", token: scraper, code: http.StatusOK, says: "# TYPE"},
		{name: "no token", method: http.MethodGet, path: "/metrics", code: http.StatusUnauthorized, says: "send a bearer token"},
		{name: "a token the API server does not accept", method: http.MethodGet, path: "/metrics", token: "not-a-token", code: http.StatusUnauthorized, says: "does not accept this token"},
		{name: "a ServiceAccount without the role", method: http.MethodGet, path: "/metrics", token: stranger, code: http.StatusForbidden,
			says: "system:serviceaccount:" + ns.Name + ":stranger may not get /metrics"},
		{name: "a verb the role does not grant", method: http.MethodPost, path: "/metrics", token: scraper, code: http.StatusForbidden, says: "may not post /metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := get(tc.method, tc.path, tc.token)
			require.NoError(t, err)
			assert.Equal(t, tc.code, code, body)
			assert.Contains(t, body, tc.says)
			if tc.token != "" {
				assert.NotContains(t, body, tc.token, "the answer repeats the token")
			}
		})
	}
}

// serveMetrics starts controller-runtime's metrics server as agentd configures it with
// --metrics-secure, and returns its address.
func serveMetrics(ctx context.Context, t *testing.T, cfg *rest.Config) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	httpClient, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	srv, err := metricsserver.NewServer(metricsserver.Options{
		BindAddress: addr, SecureServing: true, FilterProvider: metricsauth.Filter,
		CertDir: t.TempDir(),
	}, cfg, httpClient)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil && !strings.Contains(err.Error(), "context canceled") {
			t.Errorf("metrics server: %v", err)
		}
	})
	return addr
}
