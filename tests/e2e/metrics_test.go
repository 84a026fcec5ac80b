package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/scrape"
)

// TestMetricsScrape scrapes the installed operator's /metrics over HTTPS, as Prometheus
// would: a ServiceAccount bound to the chart's metrics-reader ClusterRole reads them, one
// without it is refused, and so is a request without a token. The operator checks each
// with the API server under the chart's RBAC (TestZLeastPrivilege sees those reviews).
func TestMetricsScrape(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "the operator runs in the cluster, installed by its chart")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(e.REST)
	require.NoError(t, err)

	roles, err := cs.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + harness.ReleaseName})
	require.NoError(t, err)
	reader := ""
	for _, r := range roles.Items {
		for _, rule := range r.Rules {
			if len(rule.NonResourceURLs) == 1 && rule.NonResourceURLs[0] == "/metrics" {
				reader = r.Name
			}
		}
	}
	require.NotEmpty(t, reader, "the chart installs a ClusterRole that may read /metrics")

	token := func(name string) string {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Namespace}}
		_, err := cs.CoreV1().ServiceAccounts(e.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = cs.CoreV1().ServiceAccounts(e.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		tr, err := cs.CoreV1().ServiceAccounts(e.Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		require.NoError(t, err)
		return tr.Status.Token
	}
	prometheus, stranger := token("e2e-prometheus"), token("e2e-stranger")
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-prometheus-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: e.Namespace, Name: "e2e-prometheus"}},
	}
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})

	pods, err := e.Release.Pods(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, pods)
	var urls []string
	for _, p := range pods {
		port := metricsPort(p)
		require.NotZero(t, port, "pod %s has a metrics port", p.Name)
		if p.Status.PodIP != "" {
			urls = append(urls, fmt.Sprintf("https://%s/metrics", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port))))
		}
	}
	require.NotEmpty(t, urls, "no operator pod has an address")

	for _, url := range urls {
		// Every replica serves metrics, the leader and the ones waiting to lead. The binding
		// takes a moment to reach the API server's authorizer.
		var code int
		var body string
		require.Eventually(t, func() bool {
			code, body, err = scrape.Do(ctx, http.MethodGet, url, prometheus)
			return err == nil && code == http.StatusOK
		}, time.Minute, 500*time.Millisecond, "%s for the bound ServiceAccount: %d %s %v", url, code, body, err)
		assert.Contains(t, body, "controller_runtime_", "%s serves the operator's metrics", url)

		code, body, err = scrape.Do(ctx, http.MethodGet, url, stranger)
		require.NoError(t, err)
		assert.Equal(t, http.StatusForbidden, code, "%s for a ServiceAccount without the role: %s", url, body)
		code, body, err = scrape.Do(ctx, http.MethodGet, url, "")
		require.NoError(t, err)
		assert.Equal(t, http.StatusUnauthorized, code, "%s without a token: %s", url, body)
	}
}

func metricsPort(p corev1.Pod) int {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == "metrics" {
				return int(port.ContainerPort)
			}
		}
	}
	return 0
}
