package metricsauth_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
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
	clocktesting "k8s.io/utils/clock/testing"
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

	ns, scraper, stranger := scrapers(ctx, t, cs)

	addr := serveMetrics(ctx, t, env.Config, metricsauth.Filter)
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

// scrapers makes a namespace with two ServiceAccounts, one bound to a ClusterRole that
// may get /metrics and one not, and returns the namespace and their tokens.
func scrapers(ctx context.Context, t *testing.T, cs kubernetes.Interface) (ns *corev1.Namespace, scraper, stranger string) {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	token := func(name string) string {
		_, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
		tr, err := cs.CoreV1().ServiceAccounts(ns.Name).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	scraper, stranger = token("scraper"), token("stranger")
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
	return ns, scraper, stranger
}

// reviewCounter counts the TokenReviews and SubjectAccessReviews sent through it to the
// real API server: what the filter costs the API server.
type reviewCounter struct {
	next                   http.RoundTripper
	tokenReviews, accessRs atomic.Int64
}

func (c *reviewCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(req.URL.Path, "/tokenreviews"):
		c.tokenReviews.Add(1)
	case strings.HasSuffix(req.URL.Path, "/subjectaccessreviews"):
		c.accessRs.Add(1)
	}
	return c.next.RoundTrip(req)
}

// reviews is what the counter has counted: TokenReviews, SubjectAccessReviews.
func (c *reviewCounter) reviews() [2]int64 {
	return [2]int64{c.tokenReviews.Load(), c.accessRs.Load()}
}

// TestReviewsAreCached: a scraper, or anyone, repeating a token costs the API server one
// TokenReview and one SubjectAccessReview until the answers expire (DefaultAllowTTL for
// an accepted token and an allowed access, DefaultDenyTTL for a refusal), and a bad token
// is refused every time all the same.
func TestReviewsAreCached(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cs, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)
	ns, scraper, stranger := scrapers(ctx, t, cs)

	counter := &reviewCounter{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		counter.next = rt
		return counter
	})
	now := clocktesting.NewFakeClock(time.Now())
	addr := serveMetrics(ctx, t, cfg, metricsauth.FilterWith(metricsauth.Options{Clock: now}))
	get := func(method, token string) (int, string) {
		t.Helper()
		code, body, err := scrape.Do(ctx, method, "https://"+addr+"/metrics", token)
		require.NoError(t, err)
		return code, body
	}
	// The server takes a moment to listen, and the binding to reach the API server's
	// authorizer: each try moves the clock past the refusal it may have cached.
	require.Eventually(t, func() bool {
		now.Step(metricsauth.DefaultDenyTTL + time.Second)
		code, _, err := scrape.Do(ctx, http.MethodGet, "https://"+addr+"/metrics", scraper)
		return err == nil && code == http.StatusOK
	}, 30*time.Second, 200*time.Millisecond, "the scraper ServiceAccount, bound to a role that may get /metrics, was never let in")

	const n = 20
	for _, tc := range []struct {
		name, method, token string
		code                int
		says                string
		// ttl is how long the answers are kept: one more request past it is reviewed again.
		ttl time.Duration
		// reviews is what n requests cost (TokenReviews, SubjectAccessReviews), and again
		// what one more costs past ttl: a refused access expires before the accepted token.
		reviews, again [2]int64
	}{
		{name: "allowed scraper", method: http.MethodGet, token: scraper, code: http.StatusOK, says: "# TYPE",
			ttl: metricsauth.DefaultAllowTTL, reviews: [2]int64{1, 1}, again: [2]int64{1, 1}},
		{name: "a verb the role does not grant", method: http.MethodPost, token: scraper, code: http.StatusForbidden, says: "may not post /metrics",
			ttl: metricsauth.DefaultDenyTTL, reviews: [2]int64{1, 1}, again: [2]int64{0, 1}},
		{name: "a token the API server does not accept", method: http.MethodGet, token: "not-a-token", code: http.StatusUnauthorized, says: "does not accept this token",
			ttl: metricsauth.DefaultDenyTTL, reviews: [2]int64{1, 0}, again: [2]int64{1, 0}},
		{name: "another token the API server does not accept", method: http.MethodGet, token: scraper + "x", code: http.StatusUnauthorized, says: "does not accept this token",
			ttl: metricsauth.DefaultDenyTTL, reviews: [2]int64{1, 0}, again: [2]int64{1, 0}},
		{name: "a ServiceAccount without the role", method: http.MethodGet, token: stranger, code: http.StatusForbidden,
			says: "system:serviceaccount:" + ns.Name + ":stranger may not get /metrics", ttl: metricsauth.DefaultDenyTTL, reviews: [2]int64{1, 1}, again: [2]int64{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Whatever the test kept before has expired.
			now.Step(metricsauth.DefaultAllowTTL + time.Second)
			before := counter.reviews()
			for range n {
				code, body := get(tc.method, tc.token)
				require.Equal(t, tc.code, code, body)
				require.Contains(t, body, tc.says)
			}
			after := counter.reviews()
			assert.Equal(t, tc.reviews, [2]int64{after[0] - before[0], after[1] - before[1]},
				"%d requests with one token cost the API server these TokenReviews and SubjectAccessReviews", n)

			// Just before the answers expire they still hold; just after, the next
			// request is reviewed again.
			now.Step(tc.ttl - time.Millisecond)
			get(tc.method, tc.token)
			assert.Equal(t, after, counter.reviews(), "answers kept %s are reviewed again before they expire", tc.ttl)
			now.Step(2 * time.Millisecond)
			code, body := get(tc.method, tc.token)
			assert.Equal(t, tc.code, code, body)
			again := counter.reviews()
			assert.Equal(t, tc.again, [2]int64{again[0] - after[0], again[1] - after[1]}, "answers kept %s are not reviewed again once expired", tc.ttl)
		})
	}
}

// serveMetrics starts controller-runtime's metrics server as agentd configures it with
// --metrics-secure (filter: metricsauth.Filter), and returns its address.
func serveMetrics(ctx context.Context, t *testing.T, cfg *rest.Config, filter func(*rest.Config, *http.Client) (metricsserver.Filter, error)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	httpClient, err := rest.HTTPClientFor(cfg)
	require.NoError(t, err)
	srv, err := metricsserver.NewServer(metricsserver.Options{
		BindAddress: addr, SecureServing: true, FilterProvider: filter,
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
