package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// clusterDomain is the kubelet's clusterDomain, which clusterdns serves.
const clusterDomain = "cluster.local"

// bridgeNetfilter is the sysctl that has bridged traffic pass through iptables, which
// kube-proxy's Service NAT needs between pods on one bridge.
const bridgeNetfilter = "net/bridge/bridge-nf-call-iptables"

// kubeProxyConfig makes kube-proxy serve every Service's ClusterIP to pods, in iptables mode.
// A pod's traffic keeps its source address, as on a real cluster (the hand-off endpoint checks
// it): a reply from an endpoint on the same bridge goes through iptables to be un-NATed
// because bridged traffic is passed to iptables (bridgeNetfilter). The conntrack sizes and
// timeouts are left as the host has them (0 = do not set), and NodePorts are not served on
// loopback, so kube-proxy changes no sysctl that the journal does not put back.
func (c *Cluster) kubeProxyConfig(hostname string, healthzPort, metricsPort int) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, filepath.Join(c.runDir, "kube-proxy.kubeconfig"), podSubnet, hostname, healthzPort, metricsPort)
}

// startServices starts what makes Services work for pods as on any cluster: kube-proxy for
// their ClusterIPs and clusterdns for their names (on the gateway, which the kubelet gives
// pods as their resolver). The `kubernetes` Service keeps its own forwarding
// (exposeAPIServer): the API server has no endpoints for kube-proxy to use.
func (c *Cluster) startServices(ctx context.Context, hostname string) error {
	// Recorded in the journal's sysctls at Up, put back by Down.
	if err := os.WriteFile("/proc/sys/"+bridgeNetfilter, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("passing bridged traffic to iptables (sysctl %s; is the br_netfilter module loaded?): %w", bridgeNetfilter, err)
	}
	var ports [2]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	if err := writeFile(filepath.Join(c.runDir, "kube-proxy.yaml"), c.kubeProxyConfig(hostname, ports[0], ports[1])); err != nil {
		return err
	}
	if _, err := c.startProcess("kube-proxy", filepath.Join(c.opts.BinDir, "kube-proxy"), []string{
		"--config=" + filepath.Join(c.runDir, "kube-proxy.yaml"), "--v=1",
	}, nil); err != nil {
		return err
	}
	dns := filepath.Join(c.runDir, "bin", "localnode-dns")
	if err := images.GoBuildStatic(ctx, "./tests/cluster/cmd/localnode-dns", dns); err != nil {
		return fmt.Errorf("building the cluster DNS: %w", err)
	}
	_, err := c.startProcess("localnode-dns", dns, []string{
		"-kubeconfig=" + c.kubeconfig,
		"-listen=" + net.JoinHostPort(gatewayIP, "53"),
		"-domain=" + clusterDomain,
	}, nil)
	return err
}
