package main

import (
	"flag"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
)

func init() {
	register(command{"spawner", "run only the JobSpawner (for debugging and restart tests)", runSpawner})
}

// spawnerConfig is everything `agentd spawner` is told, from flags or, for each flag, the
// environment variable named in its help (flags win).
type spawnerConfig struct {
	manager    managerConfig
	spawner    spawner.Config
	kubeconfig string
}

// spawnerManagerDefaults are the defaults of `agentd spawner`'s manager flags: no
// endpoints and no leader election unless asked for.
var spawnerManagerDefaults = managerDefaults{
	metricsAddr:          "0",
	probeAddr:            "0",
	leaderElection:       false,
	leaderElectionID:     "",
	leaderElectionIDNote: "; <spawner-name>-spawner when empty",
}

// flags returns the FlagSet of `agentd spawner`, writing into c.
func (c *spawnerConfig) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("agentd spawner", flag.ContinueOnError)
	fs.Usage = flagenv.Usage(fs, "agentd spawner [flags]")
	c.manager.bindFlags(fs, spawnerManagerDefaults)
	c.spawner.BindFlags(fs)
	flagenv.String(fs, &c.kubeconfig, "kubeconfig", "KUBECONFIG", "",
		"kubeconfig file; in-cluster config when empty")
	flagenv.Float64(fs, &c.spawner.APIWaitScale, "api-wait-scale", "BK_OPERATOR_API_WAIT_SCALE", 1,
		"scale every wait between agent API retries (tests)")
	return fs
}

// runSpawner runs the JobSpawner alone under a controller-runtime manager, as `agentd
// operator` runs it beside the controller: useful to watch a pool of agents without a
// controller, and what the restart tests kill -9.
func runSpawner(args []string) error {
	var cfg spawnerConfig
	fs := cfg.flags()
	if err := flagenv.Parse(fs, args); err != nil {
		return err
	}
	if err := cfg.spawner.FinishFlags(fs); err != nil {
		return err
	}
	if cfg.manager.leaderElectionID == "" {
		cfg.manager.leaderElectionID = cfg.spawner.Name + "-spawner"
	}
	mgr, err := cfg.manager.newManager(cfg.kubeconfig)
	if err != nil {
		return err
	}
	sc := cfg.spawner
	sc.Namespace, sc.JobNamespace = cfg.manager.namespace, cfg.manager.jobNS()
	sc.Version = version
	if err := addSpawner(mgr, sc); err != nil {
		return err
	}
	return runManager(mgr)
}
