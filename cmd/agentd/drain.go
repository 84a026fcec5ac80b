package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/drain"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

func init() {
	register(command{"drain", "before an uninstall: stop taking jobs, end the running ones on Buildkite, wait until none are left", runDrain})
}

// drainConfig is what `agentd drain` is told.
type drainConfig struct {
	namespaces
	deployment string
	timeout    time.Duration
	kubeconfig string
}

// runDrain is the chart's pre-delete hook: pkg/drain says what it does and why, within
// --timeout.
func runDrain(args []string) error {
	var c drainConfig
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	flagenv.String(fs, &c.namespace, "namespace", "BK_OPERATOR_NAMESPACE", DefaultNamespace, "namespace of the operator's Deployment")
	flagenv.String(fs, &c.jobNamespace, "job-namespace", "BK_OPERATOR_JOB_NAMESPACE", "", "namespace of the BuildJobs; -namespace when empty")
	flagenv.String(fs, &c.deployment, "deployment", "BK_OPERATOR_DEPLOYMENT", "buildkite-operator", "the operator's Deployment")
	flagenv.Duration(fs, &c.timeout, "timeout", "BK_OPERATOR_DRAIN_TIMEOUT", 2*time.Minute, "how long to wait for the running jobs to be ended")
	flagenv.String(fs, &c.kubeconfig, "kubeconfig", "KUBECONFIG", "", "kubeconfig file; in-cluster config when empty")
	fs.Usage = flagenv.Usage(fs, "agentd drain [flags]")
	if err := flagenv.Parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cl, err := drainClient(c.kubeconfig)
	if err != nil {
		return err
	}
	d := &drain.Drainer{Client: cl, Namespace: c.namespace, Deployment: c.deployment, JobNamespace: c.jobNS()}
	return d.Run(ctx)
}

func drainClient(kubeconfig string) (client.Client, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	return cl, nil
}
