package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook/certs"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	log.SetLogger(logr.Discard())
	testenv.Run(m, &env)
}

const (
	ns         = "default"
	secretName = "webhook-certs"
)

// installWebhooks creates the configurations of the Helm chart, pointed at
// 127.0.0.1:port instead of the Service and with no caBundle: the operator's certificate
// manager has to supply it. It returns the port, and the name the chart gives both
// configurations, which the operator is then told (--webhook-configuration-name).
func installWebhooks(t *testing.T) (port int, name string) {
	t.Helper()
	// PrepWithoutInstalling parses the manifests and rewrites each Service reference to a
	// URL on a free local port; its own CA is thrown away below.
	webhooks, err := helmchart.WebhookManifests(t.TempDir(), "buildkite")
	require.NoError(t, err)
	wo := envtest.WebhookInstallOptions{
		Paths:            []string{webhooks},
		LocalServingHost: "127.0.0.1",
	}
	require.NoError(t, wo.PrepWithoutInstalling())
	t.Cleanup(func() { _ = wo.Cleanup() })
	ctx := context.Background()
	require.Len(t, wo.ValidatingWebhooks, 1)
	require.Len(t, wo.MutatingWebhooks, 1)
	name = wo.ValidatingWebhooks[0].Name
	require.Equal(t, name, wo.MutatingWebhooks[0].Name, "the chart names both configurations alike")
	for _, v := range wo.ValidatingWebhooks {
		for i := range v.Webhooks {
			v.Webhooks[i].ClientConfig.CABundle = nil
		}
		require.NoError(t, env.Client.Create(ctx, v))
	}
	for _, mw := range wo.MutatingWebhooks {
		for i := range mw.Webhooks {
			mw.Webhooks[i].ClientConfig.CABundle = nil
		}
		require.NoError(t, env.Client.Create(ctx, mw))
	}
	return wo.LocalServingPort, name
}

type warnings struct {
	mu sync.Mutex
	n  int
}

func (w *warnings) HandleWarningHeader(int, string, string) { w.mu.Lock(); w.n++; w.mu.Unlock() }
func (w *warnings) take() int                               { w.mu.Lock(); defer w.mu.Unlock(); n := w.n; w.n = 0; return n }

// served dials the webhook server and returns the certificate it presents, verified
// against the caBundle the API server has for it right now, as the API server would.
func served(ctx context.Context, addr, configName string) (*x509.Certificate, error) {
	var vwc admissionv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: configName}, &vwc); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(vwc.Webhooks[0].ClientConfig.CABundle) {
		return nil, fmt.Errorf("caBundle holds no certificate")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestRotationKeepsWebhooksAnswering runs the operator's certificate manager with a
// serving certificate valid for 4s and a CA valid for 10s, and creates objects through
// the API server (which calls the webhooks over TLS) across several rotations of both.
func TestRotationKeepsWebhooksAnswering(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port, configName := installWebhooks(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))

	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          crwebhook.NewServer(crwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: t.TempDir()}),
	})
	require.NoError(t, err)
	require.NoError(t, webhook.Setup(mgr, webhook.Options{
		Namespace: ns, ServiceName: "buildkite-operator-webhook", SecretName: secretName,
		WebhookConfigurationName: configName,
		DefaultBuildEnvironment:  "rotation",
		ManageCerts:              true,
		CertValidity:             4 * time.Second,
		RotateBefore:             2 * time.Second,
		CAValidity:               10 * time.Second,
		SyncInterval:             time.Second,
		// The API server reaches the webhook at 127.0.0.1 here, not through a Service.
		ExtraHosts: []string{"127.0.0.1"},
	}))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	w := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)

	// No allowedPipelines: legal, and the webhook answers with a warning, which proves
	// it was called.
	newEnv := func(name string) *bkv1.BuildEnvironment {
		return gen.BuildEnvironment(name, gen.SetBuildEnvironmentNamespace(ns))
	}
	// The BuildEnvironment webhook fails closed, so this succeeds only once the manager
	// has minted a certificate, served it and written the CA into the configurations.
	require.Eventually(t, func() bool { return c.Create(ctx, newEnv("rotation")) == nil }, 20*time.Second, 100*time.Millisecond,
		"the webhook never came up with the operator's certificate")

	first, err := served(ctx, addr, configName)
	require.NoError(t, err)
	serials := map[string]bool{first.SerialNumber.String(): true}
	cas := map[string]bool{first.Issuer.CommonName: true}

	deadline := time.Now().Add(13 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		w.take()
		name := fmt.Sprintf("rot-%d", i)
		require.NoError(t, c.Create(ctx, newEnv(name)), "creating a BuildEnvironment at round %d", i)
		assert.Positive(t, w.take(), "the validating webhook's warnings are missing at round %d", i)

		job := gen.BuildJob(name, gen.SetBuildJobNamespace(ns), gen.SetBuildJobJobID(fmt.Sprintf("0190f1b4-8c1e-4a6a-9d7e-%012d", i)),
			gen.SetBuildJobBuildNumber(1), gen.SetBuildJobCommand("true"))
		require.NoError(t, c.Create(ctx, job), "creating a BuildJob at round %d", i)
		// The BuildJob webhooks fail open, so only their effects prove they were called.
		assert.Equal(t, "rotation", job.Spec.BuildEnvironment, "the mutating webhook did not run at round %d", i)
		assert.Equal(t, "my-app", job.Labels[bkv1.LabelPipeline], "the mutating webhook did not run at round %d", i)

		cert, err := served(ctx, addr, configName)
		require.NoError(t, err, "the served certificate does not verify against the caBundle at round %d", i)
		now := time.Now()
		assert.True(t, now.Before(cert.NotAfter), "an expired certificate is served at round %d", i)
		serials[cert.SerialNumber.String()] = true
		cas[cert.Issuer.CommonName] = true
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("serving certificates seen: %d, CAs seen: %d", len(serials), len(cas))
	assert.GreaterOrEqual(t, len(serials), 4, "the serving certificate should have been replaced several times: %v", serials)
	assert.GreaterOrEqual(t, len(cas), 2, "the CA should have been replaced: %v", cas)

	var secret corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: secretName}, &secret))
	for _, k := range []string{certs.KeyCACert, certs.KeyCAKey, certs.KeyCert, certs.KeyKey} {
		assert.NotEmpty(t, secret.Data[k], "Secret key %s", k)
	}
}

// TestEnsure checks the manager on its own: it creates the Secret, leaves a current one
// alone, repairs a damaged one and covers every host.
func TestEnsure(t *testing.T) {
	ctx := context.Background()
	const name = "ensure-certs"
	m, err := certs.New(env.Client, env.Client, certs.Config{
		Namespace: ns, SecretName: name,
		Hosts:        []string{"svc.default.svc", "127.0.0.1"},
		CertValidity: time.Hour, RotateBefore: 10 * time.Minute,
	}, logr.Discard())
	require.NoError(t, err)
	require.Error(t, m.Ready(), "nothing is served before the first Ensure")

	_, err = m.Ensure(ctx)
	// No webhook configuration names: nothing to patch, no error.
	require.NoError(t, err)
	require.NoError(t, m.Ready())
	var s1 corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s1))

	next, err := m.Ensure(ctx)
	require.NoError(t, err)
	var s2 corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s2))
	assert.Equal(t, s1.ResourceVersion, s2.ResourceVersion, "a current Secret must not be rewritten")
	assert.WithinDuration(t, time.Now().Add(50*time.Minute), next, 2*time.Minute, "next run: validity minus the margin")

	leaf, err := tls.X509KeyPair(s2.Data[certs.KeyCert], s2.Data[certs.KeyKey])
	require.NoError(t, err)
	x, err := x509.ParseCertificate(leaf.Certificate[0])
	require.NoError(t, err)
	assert.NoError(t, x.VerifyHostname("svc.default.svc"))
	assert.NoError(t, x.VerifyHostname("127.0.0.1"))
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(s2.Data[certs.KeyCACert]))
	_, err = x.Verify(x509.VerifyOptions{Roots: pool, DNSName: "svc.default.svc"})
	assert.NoError(t, err)

	s2.Data[certs.KeyCert] = []byte("not a certificate")
	require.NoError(t, env.Client.Update(ctx, &s2))
	_, err = m.Ensure(ctx)
	require.NoError(t, err)
	var s3 corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s3))
	_, err = tls.X509KeyPair(s3.Data[certs.KeyCert], s3.Data[certs.KeyKey])
	assert.NoError(t, err, "a damaged certificate is replaced")
	assert.Equal(t, s2.Data[certs.KeyCACert], s3.Data[certs.KeyCACert], "the CA is kept when only the serving certificate is damaged")
}

func TestConfigRejectsMarginLongerThanValidity(t *testing.T) {
	_, err := certs.New(env.Client, env.Client, certs.Config{
		Namespace: ns, SecretName: "x", Hosts: []string{"svc"},
		CertValidity: time.Minute, RotateBefore: time.Hour,
	}, logr.Discard())
	require.EqualError(t, err, "webhook certificates: the rotation margin (1h0m0s) must be shorter than the certificate validity (1m0s) and the CA validity (87600h0m0s)")
}

// TestEnsureWritesCAConfigMaps: the CA bundle reaches the ConfigMaps pods trust the
// operator's server by, made when missing and put right when changed.
func TestEnsureWritesCAConfigMaps(t *testing.T) {
	ctx := context.Background()
	const name = "ca-configmaps"
	key := types.NamespacedName{Namespace: ns, Name: name + "-ca"}
	m, err := certs.New(env.Client, env.Client, certs.Config{
		Namespace: ns, SecretName: name, Hosts: []string{"svc.default.svc"},
		CAConfigMaps: []types.NamespacedName{key},
	}, logr.Discard())
	require.NoError(t, err)
	_, err = m.Ensure(ctx)
	require.NoError(t, err)
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sec))
	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(ctx, key, &cm))
	assert.Equal(t, string(sec.Data[certs.KeyCACert]), cm.Data[certs.KeyCACert])

	cm.Data[certs.KeyCACert] = "stale"
	require.NoError(t, env.Client.Update(ctx, &cm))
	_, err = m.Ensure(ctx)
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, key, &cm))
	assert.Equal(t, string(sec.Data[certs.KeyCACert]), cm.Data[certs.KeyCACert], "a changed bundle is put right")
}
