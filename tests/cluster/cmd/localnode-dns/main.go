// Command localnode-dns is the local node's cluster DNS (package clusterdns): the node starts
// it on the pod network's gateway, and the kubelet names that address as the pods' resolver.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster/clusterdns"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of a user that may list and watch Services")
	listen := flag.String("listen", "", "UDP address to answer on, e.g. 10.88.0.1:53")
	domain := flag.String("domain", "cluster.local", "the cluster domain")
	resolvConf := flag.String("resolv-conf", "/etc/resolv.conf", "the host's resolver configuration: other names go to its first nameserver")
	flag.Parse()
	if err := run(*kubeconfig, *listen, *domain, *resolvConf); err != nil {
		log.Fatalf("localnode-dns: %v", err)
	}
}

func run(kubeconfig, listen, domain, resolvConf string) error {
	if kubeconfig == "" || listen == "" {
		return fmt.Errorf("-kubeconfig and -listen are needed")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	rc, err := os.ReadFile(resolvConf)
	if err != nil {
		return fmt.Errorf("reading %s: %w", resolvConf, err)
	}
	upstream, err := clusterdns.HostUpstream(string(rc))
	if err != nil {
		return fmt.Errorf("%s: %w", resolvConf, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	s := &clusterdns.Server{Domain: domain, Upstream: upstream, Logf: log.Printf}
	if err := s.Watch(ctx, cs); err != nil {
		return err
	}
	conn, err := net.ListenPacket("udp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", listen, err)
	}
	log.Printf("answering on %s for %s, other names from %s", listen, domain, upstream)
	return s.Serve(ctx, conn)
}
