package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
)

func init() {
	register(command{"spawner", "run only the JobSpawner (for debugging and restart tests)", runSpawner})
}

// runSpawner runs the JobSpawner alone under a controller-runtime manager, as `agentd
// operator` runs it beside the controller: useful to watch a pool of agents without a
// controller, and what the restart tests kill -9.
func runSpawner(args []string) error {
	fs := flag.NewFlagSet("agentd spawner", flag.ContinueOnError)
	var cfg spawner.Config
	cfg.BindFlags(fs)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; in-cluster config when empty")
	fs.StringVar(&cfg.Namespace, "namespace", envOrDefault("POD_NAMESPACE", "default"), "namespace of the BuildJobs (env POD_NAMESPACE)")
	leaderElect := fs.Bool("leader-elect", false, "take a Lease before running, so that only one spawner of this name runs")
	metricsAddr := fs.String("metrics-bind-address", "0", "address of the metrics endpoint; 0 turns it off")
	waitScale := fs.Float64("api-wait-scale", 1, "scale every wait between agent API retries (tests)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cfg.FinishFlags(fs); err != nil {
		return err
	}
	cfg.APIWaitScale = *waitScale
	cfg.Version = version

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	ctrl.SetLogger(zap.New())
	restCfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  "0",
		LeaderElection:          *leaderElect,
		LeaderElectionID:        cfg.Name + "-spawner",
		LeaderElectionNamespace: cfg.Namespace,
		Cache:                   cache.Options{DefaultNamespaces: map[string]cache.Config{cfg.Namespace: {}}},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	cfg.Cache = mgr.GetCache()
	cfg.APIReader = mgr.GetAPIReader()
	cfg.Log = ctrl.Log.WithName("spawner")
	sp, err := spawner.New(cfg, mgr.GetClient())
	if err != nil {
		return err
	}
	if err := mgr.Add(sp); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
		}
		return c, nil
	}
	return ctrl.GetConfig()
}

func envOrDefault(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
