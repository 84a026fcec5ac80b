package cluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The pod network: the CNI bridge and its gateway, which is how pods reach the host.
const (
	bridgeName  = "cni0"
	podSubnet   = "10.88.0.0/16"
	gatewayIP   = "10.88.0.1"
	gatewayCIDR = "10.88.0.1/16"
	// bridgeMAC is the bridge's own address, set so that it never changes. A Linux bridge
	// otherwise takes the lowest address among its ports, so it changed whenever a pod's veth
	// came or went; pods kept the old one in their ARP cache, and their packets to the host
	// were dropped until that entry went stale (about 30 s of a connection hanging, seen as
	// a job's cancel arriving late). 0a:58 is the locally administered prefix Kubernetes
	// network plugins use, followed by the gateway's IPv4 bytes.
	bridgeMAC   = "0a:58:0a:58:00:01"
	serviceCIDR = "10.96.0.0/16"
)

// freePort asks the kernel for a free TCP port on loopback. Another program could take it
// before the component binds it; components fail loudly then, and Up reports their log.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func writeKubeconfig(path, server, caFile, certFile, keyFile, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["localnode"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	cfg.Contexts["localnode"] = &clientcmdapi.Context{Cluster: "localnode", AuthInfo: user}
	cfg.CurrentContext = "localnode"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// containerdConfig keeps every containerd path inside the state dir (root, state, sockets,
// runc root, opt and CDI dirs) so it cannot clash with another containerd on the machine. It
// is containerd 2.x's config version 3, whose CRI plugin is split in three: images (pulls,
// the pause image, registries), runtime (runc, CNI, the sandbox's limits) and the gRPC
// service (streaming). 2.3 and later read it too (they move the gRPC and TTRPC addresses into
// server plugins as they load it, and log that they did).
func (c *Cluster) containerdConfig() string {
	d := c.runDir
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
oom_score = 0

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = %[5]q

  # NRI would listen on /var/run/nri/nri.sock, outside the state dir; no NRI plugin is used.
  [plugins."io.containerd.nri.v1.nri"]
    disable = true

  [plugins."io.containerd.image-verifier.v1.bindir"]
    bin_dir = %[6]q

  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"

    # The sandbox (pause) image, which Up imports (importImages); pinned, so the kubelet's
    # image GC keeps it.
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = %[7]q

    # Registries a test serves (a release pushed to a registry on this machine, say) are
    # described by hosts.toml files here, read at each pull (RegistryHostsDir).
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = %[8]q

  [plugins."io.containerd.cri.v1.runtime"]
    # The VM lacks CAP_SYS_RESOURCE: without this every sandbox fails to start because
    # runc cannot lower /proc/self/oom_score_adj.
    restrict_oom_score_adj = true
    enable_selinux = false
    max_container_log_line_size = 16384
    cdi_spec_dirs = [%[9]q]

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        # This containerd's own shim: containerd looks in PATH before beside itself, and
        # the host's PATH may have Debian's (docker.io brings it).
        runtime_path = %[10]q

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = %[11]q

    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = [%[12]q]
      conf_dir = %[13]q
      max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`,
		filepath.Join(d, "containerd", "root"),
		filepath.Join(d, "containerd", "state"),
		c.containerdSocket,
		c.containerdSocket+".ttrpc",
		filepath.Join(d, "containerd", "opt"),
		filepath.Join(d, "containerd", "image-verifier"),
		"docker.io/"+pauseImageName,
		c.RegistryHostsDir(),
		filepath.Join(d, "containerd", "cdi"),
		filepath.Join(c.opts.ContainerdDir, "containerd-shim-runc-v2"),
		filepath.Join(d, "runc"),
		cniBinDir,
		filepath.Join(d, "cni", "net.d"),
	)
}

// RegistryHostsDir is containerd's registry config_path: <dir>/<host:port>/hosts.toml says
// how the node pulls from host:port (plain http for a test's own registry).
func (c *Cluster) RegistryHostsDir() string { return filepath.Join(c.runDir, "certs.d") }

// TrustPlainHTTPRegistry makes the node pull from host (host:port), a registry without TLS,
// over http; containerd reads it at the next pull, without a restart.
func (c *Cluster) TrustPlainHTTPRegistry(host string) error {
	dir := filepath.Join(c.RegistryHostsDir(), host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+host, "http://"+host)
	return writeFile(filepath.Join(dir, "hosts.toml"), hosts)
}

// cniConfig is the bridge network; host-local keeps its leases inside the state dir.
func (c *Cluster) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "localnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
`, bridgeName, filepath.Join(c.runDir, "cni", "ipam"), podSubnet, gatewayIP)
}

func (c *Cluster) kubeletConfig(port, healthzPort int) string {
	pki := c.pkiDir
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %q
authorization:
  mode: Webhook
tlsCertFile: %q
tlsPrivateKeyFile: %q
containerRuntimeEndpoint: %q
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podLogsDir: %q
makeIPTablesUtilChains: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
evictionPressureTransitionPeriod: 5s
nodeStatusReportFrequency: 10s
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
fileCheckFrequency: 10s
maxPods: 110
resolvConf: /etc/resolv.conf
clusterDomain: %s
clusterDNS: [%s]
`, port, healthzPort,
		filepath.Join(pki, "ca.crt"),
		filepath.Join(pki, "kubelet-serving.crt"),
		filepath.Join(pki, "kubelet-serving.key"),
		"unix://"+c.containerdSocket,
		filepath.Join(c.runDir, "pod-logs"),
		clusterDomain, gatewayIP,
	)
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }
