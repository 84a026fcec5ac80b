package main

import (
	"flag"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/leaderelection"
	"github.com/buildkite-operator/buildkite-operator/pkg/memlimit"
	"github.com/buildkite-operator/buildkite-operator/pkg/metricsauth"
)

// DefaultNamespace holds the operator's own Secrets (registration token, slot state,
// webhook certificate) and its leader election Lease unless --namespace says otherwise.
// BuildJobs, BuildEnvironments and job pods live in --job-namespace; the chart makes that
// another namespace, so that no job can read the operator's Secrets.
const DefaultNamespace = "buildkite"

// managerConfig is what `agentd operator` and `agentd spawner` both tell their
// controller-runtime manager, from the same flags: the namespace every component works
// in, the metrics and probe endpoints, leader election and logging.
type managerConfig struct {
	namespaces
	metricsAddr   string
	metricsSecure bool
	probeAddr     string
	// webhookPort is the port the admission webhooks are served on (HTTPS), when
	// servesWebhooks: only a command that serves them has the flag.
	webhookPort    int
	servesWebhooks bool
	// pprofAddr serves Go's profiles (net/http/pprof) when not "0" or empty: off by
	// default, as they show the process's insides to anyone who can reach them.
	pprofAddr string
	// memoryLimit is the container's memory limit, which sets the collector's soft limit.
	memoryLimit      memlimit.Limit
	leaderElection   bool
	leaderElectionID string
	leader           leaderelection.Timings
	zap              zap.Options
	// kubeQPS and kubeBurst limit the operator's requests to the API server, as client-go's
	// token bucket: sustained per second, and at once.
	kubeQPS   float64
	kubeBurst int
}

// Defaults of the client-side rate limit: room for about 10 jobs a second at the operator's
// 15-20 requests per job, with a burst for 1000 slots resuming at once; the API server's
// priority and fairness protects it beyond that.
const (
	DefaultKubeAPIQPS   = 200
	DefaultKubeAPIBurst = 400
)

// managerDefaults are one command's defaults for the manager's flags.
type managerDefaults struct {
	metricsAddr      string
	probeAddr        string
	leaderElection   bool
	leaderElectionID string
	// leaderElectionIDNote ends the help of -leader-election-id.
	leaderElectionIDNote string
	// webhookPort is the default of -webhook-port; 0 for a command that serves no webhooks,
	// which then has no such flag.
	webhookPort int
}

func (m *managerConfig) bindFlags(fs *flag.FlagSet, d managerDefaults) {
	flagenv.String(fs, &m.namespace, "namespace", "BK_OPERATOR_NAMESPACE", DefaultNamespace,
		"namespace of the operator's own Secrets (registration token, slot state, webhook certificate) and its Lease")
	flagenv.String(fs, &m.jobNamespace, "job-namespace", "BK_OPERATOR_JOB_NAMESPACE", "",
		"namespace of BuildJobs, their token Secrets, BuildEnvironments and job pods; the same as -namespace when empty (jobs could then read the operator's Secrets: give them their own)")
	flagenv.String(fs, &m.metricsAddr, "metrics-bind-address", "BK_OPERATOR_METRICS_ADDR", d.metricsAddr,
		"address of the Prometheus /metrics endpoint; 0 turns it off")
	flagenv.Bool(fs, &m.metricsSecure, "metrics-secure", "BK_OPERATOR_METRICS_SECURE", false,
		"serve /metrics over HTTPS to authenticated, authorized clients only (a TokenReview and a SubjectAccessReview for GET /metrics per scrape)")
	flagenv.String(fs, &m.probeAddr, "health-probe-bind-address", "BK_OPERATOR_PROBE_ADDR", d.probeAddr,
		"address of /healthz and /readyz; 0 turns them off")
	if m.servesWebhooks = d.webhookPort > 0; m.servesWebhooks {
		flagenv.Int(fs, &m.webhookPort, "webhook-port", "BK_OPERATOR_WEBHOOK_PORT", d.webhookPort,
			"port the admission webhooks are served on (HTTPS); the webhook Service's targetPort must reach it (the chart's webhooks.port sets both)")
	}
	flagenv.String(fs, &m.pprofAddr, "pprof-bind-address", "BK_OPERATOR_PPROF_BIND_ADDRESS", "0",
		"address of Go's profiles (/debug/pprof/: heap, goroutines, CPU), unauthenticated plain HTTP: give a loopback address such as 127.0.0.1:6060 and reach it with kubectl port-forward; 0 turns it off")
	m.memoryLimit.BindFlags(fs)
	flagenv.Bool(fs, &m.leaderElection, "leader-elect", "BK_OPERATOR_LEADER_ELECT", d.leaderElection,
		"elect a leader so that only one replica takes jobs and reconciles")
	flagenv.String(fs, &m.leaderElectionID, "leader-election-id", "BK_OPERATOR_LEADER_ELECTION_ID", d.leaderElectionID,
		"name of the leader election Lease"+d.leaderElectionIDNote)
	flagenv.Float64(fs, &m.kubeQPS, "kube-api-qps", "BK_OPERATOR_KUBE_API_QPS", DefaultKubeAPIQPS,
		"requests per second the operator sends the Kubernetes API server, sustained; 0 or less: no limit in the operator")
	flagenv.Int(fs, &m.kubeBurst, "kube-api-burst", "BK_OPERATOR_KUBE_API_BURST", DefaultKubeAPIBurst,
		"requests the operator may send the Kubernetes API server at once, above --kube-api-qps")
	m.leader.BindFlags(fs)
	m.zap.BindFlags(fs)
	for _, name := range []string{"zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding"} {
		flagenv.Adopt(fs, name, envName(name))
	}
}

// namespaces are the operator's own namespace (--namespace) and that of its BuildJobs and
// job pods (--job-namespace), as every command that works with both is told them.
type namespaces struct {
	namespace, jobNamespace string
}

// jobNS is the namespace of BuildJobs and job pods: --job-namespace, or --namespace when
// that is empty.
func (n namespaces) jobNS() string {
	if n.jobNamespace != "" {
		return n.jobNamespace
	}
	return n.namespace
}

// envName is the environment variable of a flag that has no older name: BK_OPERATOR_
// and the flag's name in upper case, dashes made underscores.
func envName(flagName string) string {
	return "BK_OPERATOR_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newManager sets up logging and returns a manager for the cluster of kubeconfig (the
// in-cluster config or $KUBECONFIG when empty) that watches only m.namespace, with
// /healthz and /readyz.
func (m *managerConfig) newManager(kubeconfig string) (ctrl.Manager, error) {
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&m.zap)))
	if soft := m.memoryLimit.Apply(); soft > 0 {
		ctrl.Log.Info("the Go collector keeps the runtime's memory under a soft limit, from the container's", "memoryLimit", int64(m.memoryLimit), "softLimit", soft)
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	restCfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	restCfg.QPS, restCfg.Burst = float32(m.kubeQPS), m.kubeBurst
	if m.kubeQPS <= 0 {
		restCfg.QPS = -1 // client-go: no rate limiter
	}
	if m.leaderElection {
		if err := m.leader.Check(); err != nil {
			return nil, err
		}
	}
	webhookServer, err := m.webhookServer()
	if err != nil {
		return nil, err
	}
	opts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 m.metricsOptions(),
		HealthProbeBindAddress:  m.probeAddr,
		PprofBindAddress:        m.pprofAddr,
		WebhookServer:           webhookServer,
		LeaderElection:          m.leaderElection,
		LeaderElectionID:        m.leaderElectionID,
		LeaderElectionNamespace: m.namespace,
		// What the operator watches (BuildJobs, BuildEnvironments, pods) lives in the job
		// namespace: watch only that, which is also all its Role there allows. Its own
		// Secrets and Lease are read without a cache.
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{m.jobNS(): {}}},
	}
	buildjob.ConfigureCache(&opts.Cache)
	m.leader.Apply(&opts)
	mgr, err := ctrl.NewManager(restCfg, opts)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// webhookServer is the server of the admission webhooks, listening on -webhook-port;
// nil, controller-runtime's default, for a command without that flag. Without it the server
// would listen on controller-runtime's 9443 whatever port the Service sends to, and every
// BuildJob's admission, so every job, would fail. Port 0 is refused rather than left to
// controller-runtime, which would take it for 9443.
func (m *managerConfig) webhookServer() (crwebhook.Server, error) {
	if !m.servesWebhooks {
		return nil, nil
	}
	if m.webhookPort < 1 || m.webhookPort > 65535 {
		return nil, fmt.Errorf("-webhook-port %d: give a port from 1 to 65535", m.webhookPort)
	}
	return crwebhook.NewServer(crwebhook.Options{Port: m.webhookPort}), nil
}

// Authenticated metrics ask the API server who a scraper is and whether it may read /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// metricsOptions serves /metrics as plain HTTP, or, with --metrics-secure, over HTTPS (a
// self-signed certificate) behind a TokenReview and a SubjectAccessReview per request
// (pkg/metricsauth): a scraper's ServiceAccount needs the non-resource URL /metrics (get).
func (m *managerConfig) metricsOptions() metricsserver.Options {
	o := metricsserver.Options{BindAddress: m.metricsAddr}
	if m.metricsSecure {
		o.SecureServing = true
		o.FilterProvider = metricsauth.Filter
	}
	return o
}

// runManager runs mgr until SIGTERM or SIGINT.
func runManager(mgr ctrl.Manager) error {
	return leaderelection.Run(ctrl.SetupSignalHandler(), mgr, nil, "")
}

func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := bkv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
		}
		return c, nil
	}
	c, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("finding the cluster (KUBECONFIG or in-cluster config): %w", err)
	}
	return c, nil
}
