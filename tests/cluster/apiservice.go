package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/tests/auditlog"
)

// The in-cluster address of the API server: the `kubernetes` Service in `default`, which the
// kubelet puts in every pod as KUBERNETES_SERVICE_HOST and _PORT. The apiserver's
// certificate names it.
const (
	kubernetesServiceIP   = "10.96.0.1"
	kubernetesServicePort = 443
	// serviceChain is the nat chain that stands in for kube-proxy for that one Service. Its
	// KUBE- prefix makes Down remove it with the kubelet's chains.
	serviceChain = "KUBE-LOCALNODE-APISERVER"
)

// exposeAPIServer lets pods reach the API server the way in-cluster clients do, at
// https://10.96.0.1:443, with no kube-proxy: the apiserver listens on loopback only, so a
// socat on the bridge gateway forwards to it, and a DNAT rule sends the Service's address
// to that socat. Operators installed in the cluster (the chart, with its ServiceAccount)
// then run exactly as on any cluster.
func (c *Cluster) exposeAPIServer(ctx context.Context, apiserverPort int) error {
	port := strconv.Itoa(apiserverPort)
	if _, err := c.startProcess("apiserver-proxy", "socat", []string{
		"TCP-LISTEN:" + port + ",bind=" + gatewayIP + ",fork,reuseaddr",
		"TCP:127.0.0.1:" + port,
	}, nil); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"-t", "nat", "-N", serviceChain},
		{"-t", "nat", "-A", serviceChain, "-d", kubernetesServiceIP + "/32", "-p", "tcp", "--dport", strconv.Itoa(kubernetesServicePort),
			"-j", "DNAT", "--to-destination", net.JoinHostPort(gatewayIP, port)},
		{"-t", "nat", "-I", "PREROUTING", "-s", podSubnet, "-j", serviceChain},
	} {
		if out, err := exec.CommandContext(ctx, "iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// AuditLogPath is the API server's audit log: one JSON event per request, with the user,
// verb, resource and namespace.
func (c *Cluster) AuditLogPath() string { return filepath.Join(c.logDir, "audit.log") }

func (c *Cluster) auditArgs() ([]string, error) {
	policy := filepath.Join(c.runDir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditlog.Policy), 0o644); err != nil {
		return nil, fmt.Errorf("writing the audit policy: %w", err)
	}
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + c.AuditLogPath(),
		"--audit-log-format=json",
		"--audit-log-maxbackup=1", "--audit-log-maxsize=200",
	}, nil
}
