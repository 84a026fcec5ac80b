package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
)

// Leader election and the events the components record.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=buildkite,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=events,verbs=create;patch

func init() {
	register(command{"operator", "run the JobSpawner, the reaper controller, the webhooks and metrics", runOperator})
}

// operatorConfig is everything `agentd operator` is told, from flags or, for each flag,
// the environment variable named in its usage (flags win).
type operatorConfig struct {
	spawner           spawner.Config
	metricsAddr       string
	probeAddr         string
	leaderElection    bool
	leaderElectionID  string
	operatorImage     string
	imagePullPolicy   string
	webhooks          bool
	manageCerts       bool
	webhookService    string
	webhookSecret     string
	spawnerEnabled    bool
	unschedulableWait time.Duration
	imagePullGrace    time.Duration
	failedPodKeep     time.Duration
	jobStatusInterval time.Duration
}

func (c *operatorConfig) flags(fs *flag.FlagSet) {
	// The spawner's flags: name, agent endpoint, slots, queue, tags, registration token,
	// default build environment. The controller and the webhooks share the endpoint and
	// the default environment, so each is given once.
	c.spawner.BindFlags(fs)
	fs.StringVar(&c.spawner.Namespace, "namespace", envOr("BK_OPERATOR_NAMESPACE", "buildkite"),
		"namespace of BuildJobs, BuildEnvironments and the operator's own Secrets (env BK_OPERATOR_NAMESPACE)")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", envOr("BK_OPERATOR_METRICS_ADDR", ":8080"),
		"address of the Prometheus /metrics endpoint; 0 turns it off (env BK_OPERATOR_METRICS_ADDR)")
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", envOr("BK_OPERATOR_PROBE_ADDR", ":8081"),
		"address of /healthz and /readyz (env BK_OPERATOR_PROBE_ADDR)")
	fs.StringVar(&c.leaderElectionID, "leader-election-id", envOr("BK_OPERATOR_LEADER_ELECTION_ID", "buildkite-operator"),
		"name of the leader election Lease (env BK_OPERATOR_LEADER_ELECTION_ID)")
	fs.StringVar(&c.operatorImage, "operator-image", envOr("BK_OPERATOR_IMAGE", "bk-operator/agentd:dev"),
		"image holding agentd, for the job pods' init container (env BK_OPERATOR_IMAGE)")
	fs.StringVar(&c.imagePullPolicy, "operator-image-pull-policy", envOr("BK_OPERATOR_IMAGE_PULL_POLICY", "IfNotPresent"),
		"pull policy of the operator image in job pods (env BK_OPERATOR_IMAGE_PULL_POLICY)")
	fs.StringVar(&c.webhookService, "webhook-service", envOr("BK_OPERATOR_WEBHOOK_SERVICE", "buildkite-operator-webhook"),
		"the Service the API server calls the webhooks through (env BK_OPERATOR_WEBHOOK_SERVICE)")
	fs.StringVar(&c.webhookSecret, "webhook-secret", envOr("BK_OPERATOR_WEBHOOK_SECRET", "buildkite-operator-webhook-tls"),
		"the Secret holding the webhook's CA and serving certificate (env BK_OPERATOR_WEBHOOK_SECRET)")
	fs.BoolVar(&c.leaderElection, "leader-elect", os.Getenv("BK_OPERATOR_LEADER_ELECT") != "false",
		"elect a leader so that only one replica takes jobs and reconciles (env BK_OPERATOR_LEADER_ELECT)")
	fs.BoolVar(&c.webhooks, "webhooks", os.Getenv("BK_OPERATOR_WEBHOOKS") != "false",
		"serve the admission webhooks (env BK_OPERATOR_WEBHOOKS)")
	fs.BoolVar(&c.manageCerts, "manage-webhook-certs", os.Getenv("BK_OPERATOR_MANAGE_WEBHOOK_CERTS") != "false",
		"mint and rotate the webhook's certificates; false when cert-manager provides them (env BK_OPERATOR_MANAGE_WEBHOOK_CERTS)")
	fs.BoolVar(&c.spawnerEnabled, "spawner", os.Getenv("BK_OPERATOR_SPAWNER") != "false",
		"take jobs from Buildkite (env BK_OPERATOR_SPAWNER)")
	fs.DurationVar(&c.unschedulableWait, "unschedulable-timeout", 5*time.Minute,
		"how long a job's pod may stay unschedulable before the job fails")
	fs.DurationVar(&c.imagePullGrace, "image-pull-grace", 30*time.Second,
		"how long an image may fail to pull before the job fails")
	fs.DurationVar(&c.failedPodKeep, "failed-pod-retention", 10*time.Minute,
		"how long the pod of a failed job is kept for debugging, unless its BuildEnvironment says otherwise")
	fs.DurationVar(&c.jobStatusInterval, "job-status-interval", 5*time.Second,
		"how often job pods poll Buildkite for a cancel")
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
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

func runOperator(args []string) error {
	var cfg operatorConfig
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	cfg.flags(fs)
	zopts := zap.Options{}
	zopts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.spawner.FinishFlags(fs); err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))

	scheme, err := newScheme()
	if err != nil {
		return err
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("finding the cluster (KUBECONFIG or in-cluster config): %w", err)
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: cfg.metricsAddr},
		HealthProbeBindAddress:  cfg.probeAddr,
		LeaderElection:          cfg.leaderElection,
		LeaderElectionID:        cfg.leaderElectionID,
		LeaderElectionNamespace: cfg.spawner.Namespace,
		// Everything the operator reads lives in its own namespace: watch only that, which
		// is also all its namespaced Role allows.
		Cache: cache.Options{DefaultNamespaces: map[string]cache.Config{cfg.spawner.Namespace: {}}},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	if err := setupComponents(mgr, &cfg); err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()
	if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// setupComponents adds the controller, the webhooks and the spawner to mgr.
func setupComponents(mgr ctrl.Manager, cfg *operatorConfig) error {
	ua := "buildkite-operator/" + version
	if err := controller.Setup(mgr, controller.Options{
		OperatorImage:           cfg.operatorImage,
		OperatorImagePullPolicy: corev1.PullPolicy(cfg.imagePullPolicy),
		AgentEndpoint:           cfg.spawner.Endpoint,
		DefaultBuildEnvironment: cfg.spawner.DefaultBuildEnvironment,
		AgentAPI:                agentapi.Config{UserAgent: ua},
		UnschedulableTimeout:    cfg.unschedulableWait,
		ImagePullGrace:          cfg.imagePullGrace,
		FailedPodRetention:      cfg.failedPodKeep,
		JobStatusInterval:       cfg.jobStatusInterval,
	}); err != nil {
		return fmt.Errorf("setting up the controller: %w", err)
	}
	if cfg.webhooks {
		if err := webhook.Setup(mgr, webhook.Options{
			Namespace:               cfg.spawner.Namespace,
			ServiceName:             cfg.webhookService,
			SecretName:              cfg.webhookSecret,
			WebhookConfigNames:      []string{"buildkite-operator"},
			DefaultBuildEnvironment: cfg.spawner.DefaultBuildEnvironment,
			ManageCerts:             cfg.manageCerts,
		}); err != nil {
			return fmt.Errorf("setting up the webhooks: %w", err)
		}
	}
	if !cfg.spawnerEnabled {
		return nil
	}
	sc := cfg.spawner
	sc.Cache = mgr.GetCache()
	sc.APIReader = mgr.GetAPIReader()
	sc.UserAgent = ua
	sc.Version = version
	sc.Log = ctrl.Log.WithName("spawner")
	sp, err := spawner.New(sc, mgr.GetClient())
	if err != nil {
		return fmt.Errorf("setting up the spawner: %w", err)
	}
	return mgr.Add(sp)
}
