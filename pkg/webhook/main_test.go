package webhook_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

// defaultEnvironment is the operator's default BuildEnvironment in these tests.
const defaultEnvironment = "default-env"

// TestMain starts an API server with the webhook configurations of the Helm chart
// (envtest points them at a local port and signs a serving certificate for it) and a
// manager serving the webhooks there.
func TestMain(m *testing.M) {
	// Quiet unless asked: the denials these tests provoke are not news.
	log.SetLogger(logr.Discard())
	if os.Getenv("WEBHOOK_TEST_DEBUG") != "" {
		log.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true)))
	}
	manifests, err := os.MkdirTemp("", "webhook-manifests")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer func() { _ = os.RemoveAll(manifests) }()
	webhooks, err := helmchart.WebhookManifests(manifests, "buildkite")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e, err := testenv.Start(func(te *envtest.Environment) {
		te.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{webhooks}}
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env = e
	ctx, cancel := context.WithCancel(context.Background())
	code := func() int {
		wo := &e.WebhookInstallOptions
		mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
			Scheme:                 e.Scheme,
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
			WebhookServer: crwebhook.NewServer(crwebhook.Options{
				Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
			}),
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
			return 1
		}
		if err := webhook.Setup(mgr, webhook.Options{DefaultBuildEnvironment: defaultEnvironment, AgentEndpoint: "https://agent.buildkite.com/v3"}); err != nil {
			fmt.Fprintln(os.Stderr, "webhook setup:", err)
			return 1
		}
		go func() {
			if err := mgr.Start(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "manager stopped:", err)
			}
		}()
		if err := waitTLS(net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort)), 30*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	cancel()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping envtest:", err)
	}
	os.Exit(code)
}

// waitTLS waits until a TLS server answers at addr.
func waitTLS(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("webhook server at %s not up: %w", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// warnings records the warnings the API server sends back.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// take returns the warnings recorded so far and forgets them.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// newClient is a client whose API warnings are recorded.
func newClient(t *testing.T) (client.Client, *warnings) {
	t.Helper()
	w := &warnings{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c, w
}
