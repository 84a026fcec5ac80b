// Command localnode starts, inspects and stops the single-node Kubernetes of package
// cluster: `localnode up`, `localnode status`, `localnode down`. It needs root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster"
)

func main() {
	var opts cluster.Options
	flag.StringVar(&opts.StateDir, "state", cluster.DefaultStateDir(), "state dir (default $LOCALNODE_STATE or .cache/localnode)")
	flag.StringVar(&opts.BinDir, "bin-dir", "", "folder with kube-apiserver, kubelet, kube-scheduler, kube-controller-manager, kube-proxy (default .cache/kube-v1.35.4)")
	flag.StringVar(&opts.EtcdBin, "etcd", "", "etcd binary (default .cache/etcd-v3.6.6/etcd)")
	flag.StringVar(&opts.ContainerdDir, "containerd-dir", "", "folder with containerd, containerd-shim-runc-v2 and ctr (default .cache/containerd-"+cluster.ContainerdVersion+")")
	flag.StringVar(&opts.ImagesDir, "images", "", "folder of image tarballs (*.tar) to import at start")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: localnode [flags] up|down|status|run\n\n"+
			"  up      start the node and return (stop it later with down)\n"+
			"  down    stop the recorded node and put the host back as it was\n"+
			"  status  show the node's processes and readiness (exit 1 if unhealthy)\n"+
			"  run     start the node, wait for Ctrl-C, then stop it\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	opts.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s localnode: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch flag.Arg(0) {
	case "up":
		c, err := cluster.Up(ctx, opts)
		if err != nil {
			fail(err)
		}
		fmt.Printf("export KUBECONFIG=%s\n", c.Kubeconfig())
	case "run":
		c, err := cluster.Up(ctx, opts)
		if err != nil {
			fail(err)
		}
		fmt.Printf("export KUBECONFIG=%s\n# Ctrl-C stops the node\n", c.Kubeconfig())
		<-ctx.Done()
		if err := c.Down(context.WithoutCancel(ctx)); err != nil {
			fail(err)
		}
	case "down":
		c, err := cluster.Open(opts)
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(os.Stderr, "localnode: no node recorded in %s: nothing to stop\n", opts.StateDir)
			return
		}
		if err != nil {
			fail(err)
		}
		// Finish the cleanup even if interrupted: a half-stopped node is worse.
		if err := c.Down(context.WithoutCancel(ctx)); err != nil {
			fail(err)
		}
	case "status":
		c, err := cluster.Open(opts)
		if errors.Is(err, os.ErrNotExist) {
			fmt.Printf("no node recorded in %s\n", opts.StateDir)
			os.Exit(1)
		}
		if err != nil {
			fail(err)
		}
		text, healthy := c.Status(ctx)
		fmt.Print(text)
		if !healthy {
			os.Exit(1)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "localnode:", err)
	os.Exit(1)
}
