package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/discovery"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildenvironment"
	"github.com/buildkite-operator/buildkite-operator/pkg/controller/buildjob"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/imagevolume"
	"github.com/buildkite-operator/buildkite-operator/pkg/leaderelection"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/seal"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/startupcheck"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
)

// The events the components record in the operator's namespace; the Lease's rules are
// pkg/leaderelection's.
// +kubebuilder:rbac:groups="",namespace=buildkite,resources=events,verbs=create;patch

func init() {
	register(command{"operator", "run the JobSpawner, the reaper controller, the webhooks and metrics", runOperator})
}

// operatorConfig is everything `agentd operator` is told, from flags or, for each flag,
// the environment variable named in its help (flags win).
type operatorConfig struct {
	manager    managerConfig
	spawner    spawner.Config
	controller buildjob.Options
	webhook    webhook.Options
	preflight  startupcheck.Config
	warm       warmConfig
	// webhooks serves the admission webhooks; spawnerEnabled takes jobs from Buildkite.
	webhooks       bool
	spawnerEnabled bool
}

// operatorManagerDefaults are the defaults of `agentd operator`'s manager flags.
var operatorManagerDefaults = managerDefaults{
	metricsAddr:      ":8080",
	probeAddr:        ":8081",
	leaderElection:   true,
	leaderElectionID: "buildkite-operator",
	webhookPort:      9443,
}

// flags returns the FlagSet of `agentd operator`, writing into c. Each component binds
// its own flags. The values several components share are bound once, and components
// copies them into the others: the namespace (a manager flag), the agent endpoint and the
// default build environment (spawner flags).
func (c *operatorConfig) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("agentd operator", flag.ContinueOnError)
	fs.Usage = flagenv.Usage(fs, "agentd operator [flags]")
	c.manager.bindFlags(fs, operatorManagerDefaults)
	c.spawner.BindFlags(fs)
	c.controller.BindFlags(fs)
	c.webhook.BindFlags(fs)
	c.preflight.BindFlags(fs)
	c.warm.bindFlags(fs)
	flagenv.Bool(fs, &c.webhooks, "webhooks", "BK_OPERATOR_WEBHOOKS", true,
		"serve the admission webhooks")
	flagenv.Bool(fs, &c.spawnerEnabled, "spawner", "BK_OPERATOR_SPAWNER", true,
		"take jobs from Buildkite")
	return fs
}

func runOperator(args []string) error {
	var cfg operatorConfig
	fs := cfg.flags()
	if err := flagenv.Parse(fs, args); err != nil {
		return err
	}
	if err := cfg.spawner.FinishFlags(fs); err != nil {
		return err
	}
	mgr, err := cfg.manager.newManager("")
	if err != nil {
		return err
	}
	sp, err := setupComponents(mgr, &cfg)
	if err != nil {
		return err
	}
	if err := addPreflight(mgr, &cfg); err != nil {
		return err
	}
	// A nil *spawner.Spawner put in the interface would make it non-nil, and Run would call it.
	var lingerer leaderelection.Lingerer
	if sp != nil {
		lingerer = sp
	}
	return leaderelection.Run(ctrl.SetupSignalHandler(), mgr, lingerer, cfg.manager.probeAddr)
}

// components returns the controller's and the webhooks' options, completed with what
// they share with the spawner and the manager.
func (c *operatorConfig) components() (buildjob.Options, webhook.Options) {
	co := c.controller
	co.AgentEndpoint = c.spawner.Endpoint
	co.AllowedAgentEndpoints = c.spawner.AllowedEndpoints
	co.DefaultBuildEnvironment = c.spawner.DefaultBuildEnvironment
	co.AgentAPI.UserAgent = userAgent()
	wo := c.webhook
	wo.Namespace = c.manager.namespace
	wo.DefaultBuildEnvironment = c.spawner.DefaultBuildEnvironment
	wo.AgentEndpoint = c.spawner.Endpoint
	wo.AllowedAgentEndpoints = c.spawner.AllowedEndpoints
	return co, wo
}

func userAgent() string { return "buildkite-operator/" + version }

// setupComponents adds the controller, the webhooks and the spawner to mgr. It returns
// the spawner, nil when it is turned off.
func setupComponents(mgr ctrl.Manager, cfg *operatorConfig) (*spawner.Spawner, error) {
	co, wo := cfg.components()
	co.Webhooks = cfg.webhooks
	co.Seal = &seal.Source{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: cfg.manager.namespace}
	binaries, err := chooseBinaries(mgr, co.BinariesFrom, cfg.manager.jobNS(), co.OperatorImage)
	if err != nil {
		return nil, err
	}
	co.Binaries = binaries
	warm := setupWarmPools(cfg, &co, &wo, cfg.manager.jobNS())
	if warm != nil {
		demand, err := warmDemand(mgr, cfg)
		if err != nil {
			return nil, err
		}
		warm.Demand = demand
	}
	if err := buildjob.Setup(mgr, co); err != nil {
		return nil, fmt.Errorf("setting up the controller: %w", err)
	}
	if err := buildenvironment.Setup(mgr, warm); err != nil {
		return nil, fmt.Errorf("setting up the BuildEnvironment controller: %w", err)
	}
	if cfg.webhooks {
		if err := webhook.Setup(mgr, wo); err != nil {
			return nil, fmt.Errorf("setting up the webhooks: %w", err)
		}
	}
	if warm != nil {
		if err := serveHandoff(mgr, warm, co.HandoffAudience, cfg.warm.checkAddress); err != nil {
			return nil, err
		}
	}
	if !cfg.spawnerEnabled {
		return nil, nil
	}
	sc := cfg.spawner
	sc.Namespace, sc.JobNamespace = cfg.manager.namespace, cfg.manager.jobNS()
	sc.UserAgent = userAgent()
	sc.Version = version
	return newSpawner(mgr, sc)
}

// chooseBinaries decides how job pods get their binaries (imagevolume.Choose), once,
// before any pod is built, and logs what it chose and why: warm pods and job pods must
// agree, and an operator that changed its mind mid-way would leave warm pods that fit no
// job.
func chooseBinaries(mgr ctrl.Manager, mode imagevolume.Mode, jobNamespace, operatorImage string) (podbuilder.Binaries, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server := ""
	if mode == imagevolume.Auto {
		disco, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
		if err != nil {
			return "", fmt.Errorf("asking the API server its version: %w", err)
		}
		info, err := disco.ServerVersion()
		if err != nil {
			return "", fmt.Errorf("asking the API server its version: %w", err)
		}
		server = info.GitVersion
	}
	d, err := imagevolume.Choose(ctx, mode, imagevolume.Cluster{
		ServerVersion: server, Nodes: mgr.GetAPIReader(), Pods: mgr.GetClient(), Namespace: jobNamespace, Image: operatorImage})
	if err != nil {
		return "", err
	}
	ctrl.Log.WithName("setup").Info("job pods get the supervisor and buildkite-agent", "binaries", d.Binaries, "because", d.Reason)
	return d.Binaries, nil
}

// addSpawner adds a spawner configured by sc to mgr, watching mgr's cache.
func addSpawner(mgr ctrl.Manager, sc spawner.Config) error {
	_, err := newSpawner(mgr, sc)
	return err
}

// newSpawner is addSpawner, returning the spawner.
func newSpawner(mgr ctrl.Manager, sc spawner.Config) (*spawner.Spawner, error) {
	sc.Cache = mgr.GetCache()
	sc.APIReader = mgr.GetAPIReader()
	sc.Log = ctrl.Log.WithName("spawner")
	sp, err := spawner.New(sc, mgr.GetClient())
	if err != nil {
		return nil, fmt.Errorf("setting up the spawner: %w", err)
	}
	if err := mgr.Add(sp); err != nil {
		return nil, fmt.Errorf("adding the spawner: %w", err)
	}
	// /readyz: on the leader, every slot is registered with Buildkite (a standby is ready:
	// it serves the webhooks). /healthz: no slot has stopped pinging or heartbeating.
	if err := mgr.AddReadyzCheck("spawner", sp.ReadyCheck); err != nil {
		return nil, fmt.Errorf("adding the spawner's readiness check: %w", err)
	}
	if err := mgr.AddHealthzCheck("spawner", sp.LiveCheck); err != nil {
		return nil, fmt.Errorf("adding the spawner's liveness check: %w", err)
	}
	return sp, nil
}
