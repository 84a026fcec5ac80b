// Package cluster brings up a real single-node Kubernetes on this machine: etcd,
// kube-apiserver, containerd 2.x (built from Go modules) with runc and the CNI bridge,
// kubelet, kube-scheduler, kube-controller-manager, kube-proxy and a cluster DNS for Service
// names (clusterdns), for end-to-end tests and the demo. It needs root.
//
// Everything it writes lives in a state dir, except a few paths the kubelet and containerd
// use whatever they are told (see hostPaths). Every change to the host is recorded in the
// state dir before it is made, and Down undoes exactly those changes, also after a crash.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

const pauseImageName = images.PauseImage

// cniBinDir is where Debian's containernetworking-plugins puts the plugins.
const cniBinDir = "/usr/lib/cni"

// hostPaths are used by the kubelet, containerd and the CNI plugins whatever the
// configuration says. Those that did not exist before Up are removed by Down.
var hostPaths = []string{
	"/run/containerd",
	"/run/netns",
	"/var/lib/cni",
	"/var/log/containers",
	"/var/log/pods",
	"/var/lib/kubelet",
	"/opt/containerd",
	"/etc/cni",
	"/opt/cni",
}

// Options configures a node.
type Options struct {
	// StateDir holds everything the node writes; default $LOCALNODE_STATE or
	// <repo>/.cache/localnode.
	StateDir string
	// BinDir holds kube-apiserver, kubelet, kube-scheduler, kube-controller-manager and kube-proxy;
	// default <repo>/.cache/kube-v1.35.4.
	BinDir string
	// EtcdBin is the etcd binary; default <repo>/.cache/etcd-v3.6.6/etcd.
	EtcdBin string
	// ContainerdDir holds containerd, containerd-shim-runc-v2 and ctr; default
	// DefaultContainerdDir().
	ContainerdDir string
	// ImagesDir, when set, holds image tarballs (*.tar) imported at start.
	ImagesDir string
	// Logf receives progress messages; nil discards them.
	Logf func(string, ...any)

	// heldLock is the machine lock already taken by the caller (tests that must look at
	// the host before and after the node without another node starting in between).
	heldLock *os.File
}

// Cluster is a running (or recorded) node.
type Cluster struct {
	opts             Options
	j                *journal
	runDir           string
	logDir           string
	pkiDir           string
	containerdSocket string
	kubeconfig       string
	exited           map[string]chan struct{}
	// lock is held from Up to Down (nil for a node opened from its state dir); ownsLock
	// says whether Down releases it.
	lock     *os.File
	ownsLock bool
}

// ContainerdVersion is the containerd the node runs unless told otherwise: the Makefile's
// CONTAINERD_VERSION, which `make cluster-binaries` builds into DefaultContainerdDir. Image
// volumes need 2.1 or later.
const ContainerdVersion = "v2.4.2"

// containerdBinaries are what the node runs from Options.ContainerdDir.
var containerdBinaries = []string{"containerd", "containerd-shim-runc-v2", "ctr"}

// DefaultContainerdDir is <repo>/.cache/containerd-<ContainerdVersion>.
func DefaultContainerdDir() string {
	return filepath.Join(testkit.RepoRoot(), ".cache", "containerd-"+ContainerdVersion)
}

// DefaultStateDir is $LOCALNODE_STATE, else <repo>/.cache/localnode.
func DefaultStateDir() string {
	if d := os.Getenv("LOCALNODE_STATE"); d != "" {
		return d
	}
	return filepath.Join(testkit.RepoRoot(), ".cache", "localnode")
}

func (o *Options) defaults() error {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir()
	}
	if o.BinDir == "" {
		o.BinDir = filepath.Join(testkit.RepoRoot(), ".cache", "kube-v1.35.4")
	}
	if o.EtcdBin == "" {
		o.EtcdBin = filepath.Join(testkit.RepoRoot(), ".cache", "etcd-v3.6.6", "etcd")
	}
	if o.ContainerdDir == "" {
		o.ContainerdDir = DefaultContainerdDir()
	}
	var err error
	if o.StateDir, err = filepath.Abs(o.StateDir); err != nil {
		return err
	}
	// containerd's config names the shim by its path, which must be absolute.
	if o.ContainerdDir, err = filepath.Abs(o.ContainerdDir); err != nil {
		return err
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

func newCluster(opts Options) (*Cluster, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	run := filepath.Join(opts.StateDir, "run")
	return &Cluster{
		opts:             opts,
		runDir:           run,
		logDir:           filepath.Join(opts.StateDir, "logs"),
		pkiDir:           filepath.Join(run, "pki"),
		containerdSocket: filepath.Join(run, "containerd.sock"),
		kubeconfig:       filepath.Join(opts.StateDir, "kubeconfig"),
		exited:           map[string]chan struct{}{},
	}, nil
}

func (c *Cluster) logf(format string, args ...any) { c.opts.Logf(format, args...) }

func (c *Cluster) journalPath() string { return filepath.Join(c.opts.StateDir, "host.json") }

// Open returns the node recorded in the state dir, running or crashed, so that it can be
// inspected or stopped. It fails with os.ErrNotExist when none is recorded.
func Open(opts Options) (*Cluster, error) {
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	j, err := loadJournal(c.journalPath())
	if err != nil {
		return nil, err
	}
	c.j = j
	return c, nil
}

// Kubeconfig is the admin kubeconfig's path.
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// BinDir holds the node's Kubernetes binaries, kubectl among them.
func (c *Cluster) BinDir() string { return c.opts.BinDir }

// RESTConfig is an admin client configuration.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", c.kubeconfig, err)
	}
	return cfg, nil
}

// HostAddress is the address pods on the bridge use to reach a server on the host (the
// bridge's gateway; it exists from Up on). hostNetwork pods use 127.0.0.1 instead.
func (c *Cluster) HostAddress() string { return gatewayIP }

// NodeName is the node's name (the host name).
func (c *Cluster) NodeName() string { return c.j.Hostname }

// LogDir holds each component's log.
func (c *Cluster) LogDir() string { return c.logDir }

// ContainerdSocket is the node's containerd, for `Ctr() -a <socket> -n k8s.io ...`.
func (c *Cluster) ContainerdSocket() string { return c.containerdSocket }

// Ctr is the ctr built with the node's containerd (the host's may be another version, or
// missing).
func (c *Cluster) Ctr() string { return filepath.Join(c.opts.ContainerdDir, "ctr") }

// ImportImage imports a `docker save` or OCI tarball into the node's containerd, where pods
// find it with imagePullPolicy Never or IfNotPresent.
func (c *Cluster) ImportImage(ctx context.Context, tarPath string) error {
	out, err := exec.CommandContext(ctx, c.Ctr(), "-a", c.containerdSocket, "-n", "k8s.io", "images", "import", tarPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("importing image %s: %w: %s", tarPath, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// checkPrerequisites reports everything missing at once, with how to get it.
func (c *Cluster) checkPrerequisites() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root: the node mounts, creates cgroups and network devices (run as root)")
	}
	for _, b := range []string{"kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(c.opts.BinDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s in %s (make cluster-binaries)", b, c.opts.BinDir))
		}
	}
	if _, err := os.Stat(c.opts.EtcdBin); err != nil {
		missing = append(missing, fmt.Sprintf("etcd at %s (make envtest-assets)", c.opts.EtcdBin))
	}
	for _, b := range containerdBinaries {
		if _, err := os.Stat(filepath.Join(c.opts.ContainerdDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s in %s (make cluster-binaries)", b, c.opts.ContainerdDir))
		}
	}
	for _, b := range []string{"runc", "iptables", "ip", "go", "socat"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b+" (make node-deps)")
		}
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "bridge")); err != nil {
		missing = append(missing, "CNI plugins in "+cniBinDir+" (make node-deps)")
	}
	if pids := processesNamed("kubelet"); len(pids) > 0 {
		missing = append(missing, fmt.Sprintf("no other kubelet running (pids %v): two kubelets would share the kubepods cgroups; stop it first (`localnode down` for a node of this tool, maybe with -state)", pids))
	}
	if len(missing) > 0 {
		return fmt.Errorf("cannot start the local node, missing:\n  %s", strings.Join(missing, "\n  "))
	}
	return nil
}

// Up starts a node and waits until it is Ready and the default ServiceAccount exists. A
// node recorded in the state dir (left by a crash or never stopped) is stopped first.
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	if c.lock = opts.heldLock; c.lock == nil {
		if c.lock, err = machineLock(ctx, c.logf); err != nil {
			return nil, err
		}
		c.ownsLock = true
	}
	if old, err := Open(opts); err == nil {
		c.logf("a node is recorded in %s: stopping it first", old.opts.StateDir)
		if err := old.Down(ctx); err != nil {
			c.unlock()
			return nil, fmt.Errorf("stopping the node recorded in %s: %w", old.opts.StateDir, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		c.unlock()
		return nil, err
	}
	if err := c.checkPrerequisites(); err != nil {
		c.unlock()
		return nil, err
	}
	start := time.Now()
	if err := c.up(ctx); err != nil {
		c.logf("start failed: %v; cleaning up", err)
		if derr := c.Down(context.Background()); derr != nil {
			err = fmt.Errorf("%w (and cleaning up: %v)", err, derr)
		}
		c.unlock()
		return nil, err
	}
	c.logf("node %s ready in %s; kubeconfig %s", c.j.Hostname, time.Since(start).Round(10*time.Millisecond), c.kubeconfig)
	return c, nil
}

func (c *Cluster) up(ctx context.Context) error {
	for _, d := range []string{c.opts.StateDir, c.logDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	// A leftover run dir belongs to a node Down already took apart (or never started).
	if err := os.RemoveAll(c.runDir); err != nil {
		return fmt.Errorf("clearing %s: %w", c.runDir, err)
	}
	hostname, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("reading the host name: %w", err)
	}
	hostname = strings.ToLower(hostname)

	// Record the host as it is, before anything changes it.
	c.j = &journal{path: c.journalPath(), Sysctls: readSysctls(), Chains: snapshotChains(), Netns: listNetns(), Hostname: hostname}
	for _, p := range hostPaths {
		if !pathExists(p) {
			c.j.Paths = append(c.j.Paths, p)
		}
	}
	for _, cg := range cgroupRoots() {
		if !pathExists(cg) {
			c.j.Cgroups = append(c.j.Cgroups, cg)
		}
	}
	if err := c.j.save(); err != nil {
		return err
	}

	// The apiserver reaches the kubelet by host name; the kubelet serves on 127.0.0.1.
	if !hostsHasLoopbackName(hostname) {
		c.j.HostsLine = "127.0.0.1 " + hostname + " # localnode"
		if err := c.j.save(); err != nil {
			return err
		}
		if err := appendHostsLine(c.j.HostsLine); err != nil {
			return err
		}
	}
	// The bridge exists from the start so that HostAddress can be listened on before the
	// first pod; the CNI plugin adopts it.
	if _, err := net.InterfaceByName(bridgeName); err != nil {
		c.j.Links = append(c.j.Links, bridgeName)
		if err := c.j.save(); err != nil {
			return err
		}
		for _, args := range [][]string{
			{"link", "add", bridgeName, "type", "bridge"},
			{"link", "set", bridgeName, "address", bridgeMAC},
			{"addr", "add", gatewayCIDR, "dev", bridgeName},
			{"link", "set", bridgeName, "up"},
		} {
			if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
			}
		}
	}

	if err := c.writePKI(hostname); err != nil {
		return err
	}
	ports := map[string]int{}
	for _, name := range []string{"etcd", "etcd-peer", "apiserver", "kubelet", "kubelet-healthz"} {
		if ports[name], err = freePort(); err != nil {
			return err
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", ports["apiserver"])
	c.j.APIServer = server
	if err := c.j.save(); err != nil {
		return err
	}
	pki := func(n string) string { return filepath.Join(c.pkiDir, n) }
	kubeconfigs := []struct{ path, cert, user string }{
		{c.kubeconfig, "admin", "admin"},
		{filepath.Join(c.runDir, "kubelet.kubeconfig"), "kubelet", "system:node:" + hostname},
		{filepath.Join(c.runDir, "scheduler.kubeconfig"), "scheduler", "system:kube-scheduler"},
		{filepath.Join(c.runDir, "controller-manager.kubeconfig"), "controller-manager", "system:kube-controller-manager"},
		{filepath.Join(c.runDir, "kube-proxy.kubeconfig"), "kube-proxy", "system:kube-proxy"},
	}
	for _, k := range kubeconfigs {
		if err := writeKubeconfig(k.path, server, pki("ca.crt"), pki(k.cert+".crt"), pki(k.cert+".key"), k.user); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(c.runDir, "containerd.toml"), c.containerdConfig()); err != nil {
		return err
	}
	// Written in place before containerd starts: containerd 1.6 missed files renamed into
	// the folder later.
	if err := writeFile(filepath.Join(c.runDir, "cni", "net.d", "10-localnode.conflist"), c.cniConfig()); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(c.runDir, "kubelet.yaml"), c.kubeletConfig(ports["kubelet"], ports["kubelet-healthz"])); err != nil {
		return err
	}

	t0 := time.Now()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports["etcd"])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports["etcd-peer"])
	if _, err := c.startProcess("etcd", c.opts.EtcdBin, []string{
		"--name=localnode", "--data-dir=" + filepath.Join(c.runDir, "etcd"),
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=localnode=" + peerURL,
		"--listen-metrics-urls=", "--unsafe-no-fsync=true", "--log-level=warn",
	}, nil); err != nil {
		return err
	}
	audit, err := c.auditArgs()
	if err != nil {
		return err
	}
	if _, err := c.startProcess("kube-apiserver", filepath.Join(c.opts.BinDir, "kube-apiserver"), append([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + itoa(ports["apiserver"]),
		"--endpoint-reconciler-type=none",
		"--service-cluster-ip-range=" + serviceCIDR,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki("sa.pub"),
		"--service-account-signing-key-file=" + pki("sa.key"),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--client-ca-file=" + pki("ca.crt"),
		"--tls-cert-file=" + pki("apiserver.crt"), "--tls-private-key-file=" + pki("apiserver.key"),
		"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + pki("ca.crt"),
		"--kubelet-preferred-address-types=Hostname,InternalIP",
		"--profiling=false",
		// Webhook calls go to the Service's endpoints (pod IPs on the bridge), since no
		// kube-proxy serves Service IPs on this node.
		"--enable-aggregator-routing=true",
		"--v=1",
	}, audit...), nil); err != nil {
		return err
	}
	if _, err := c.startProcess("containerd", filepath.Join(c.opts.ContainerdDir, "containerd"), []string{"--config", filepath.Join(c.runDir, "containerd.toml")}, nil); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd", 30*time.Second, func() error {
		return exec.CommandContext(ctx, c.Ctr(), "-a", c.containerdSocket, "version").Run()
	}); err != nil {
		return err
	}
	c.logf("containerd up after %s", time.Since(t0).Round(10*time.Millisecond))
	if err := c.importImages(ctx); err != nil {
		return err
	}

	cfg, err := c.RESTConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	if err := c.waitFor(ctx, "kube-apiserver", 90*time.Second, func() error {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	}); err != nil {
		return err
	}
	c.logf("kube-apiserver ready after %s", time.Since(t0).Round(10*time.Millisecond))
	if err := c.exposeAPIServer(ctx, ports["apiserver"]); err != nil {
		return err
	}
	if err := c.startServices(ctx, hostname); err != nil {
		return err
	}

	if _, err := c.startProcess("kubelet", filepath.Join(c.opts.BinDir, "kubelet"), []string{
		"--config=" + filepath.Join(c.runDir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(c.runDir, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(c.runDir, "kubelet"),
		"--cert-dir=" + filepath.Join(c.runDir, "kubelet", "pki"),
		"--hostname-override=" + hostname,
		"--v=1",
	}, nil); err != nil {
		return err
	}
	if _, err := c.startProcess("kube-scheduler", filepath.Join(c.opts.BinDir, "kube-scheduler"), []string{
		"--kubeconfig=" + filepath.Join(c.runDir, "scheduler.kubeconfig"),
		"--authentication-kubeconfig=" + filepath.Join(c.runDir, "scheduler.kubeconfig"),
		"--authorization-kubeconfig=" + filepath.Join(c.runDir, "scheduler.kubeconfig"),
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", "--v=1",
	}, nil); err != nil {
		return err
	}
	if _, err := c.startProcess("kube-controller-manager", filepath.Join(c.opts.BinDir, "kube-controller-manager"), []string{
		"--kubeconfig=" + filepath.Join(c.runDir, "controller-manager.kubeconfig"),
		"--authentication-kubeconfig=" + filepath.Join(c.runDir, "controller-manager.kubeconfig"),
		"--authorization-kubeconfig=" + filepath.Join(c.runDir, "controller-manager.kubeconfig"),
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pki("sa.key"),
		"--root-ca-file=" + pki("ca.crt"),
		"--cluster-signing-cert-file=" + pki("ca.crt"),
		"--cluster-signing-key-file=" + pki("ca.key"),
		"--v=1",
	}, nil); err != nil {
		return err
	}

	if err := c.waitFor(ctx, "node Ready", 90*time.Second, func() error {
		node, err := cs.CoreV1().Nodes().Get(ctx, hostname, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node %s not ready: %s", hostname, cond.Message)
			}
		}
		return fmt.Errorf("node %s has no Ready condition yet", hostname)
	}); err != nil {
		return err
	}
	c.logf("node Ready after %s", time.Since(t0).Round(10*time.Millisecond))
	if err := c.waitFor(ctx, "default ServiceAccount", 90*time.Second, func() error {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	return nil
}

func (c *Cluster) writePKI(hostname string) error {
	p, err := newPKI(c.pkiDir)
	if err != nil {
		return err
	}
	loop := net.ParseIP("127.0.0.1")
	pairs := []keyPair{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			dns: []string{"localhost", hostname, "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			ips: []net.IP{loop, net.ParseIP("10.96.0.1"), net.ParseIP(gatewayIP)}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{name: "admin", cn: "localnode-admin", orgs: []string{"system:masters"}},
		{name: "kubelet", cn: "system:node:" + hostname, orgs: []string{"system:nodes"}},
		{name: "kubelet-serving", cn: hostname, server: true, dns: []string{hostname, "localhost"}, ips: []net.IP{loop}},
		{name: "scheduler", cn: "system:kube-scheduler"},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		// Bound to system:node-proxier by the API server's default policy.
		{name: "kube-proxy", cn: "system:kube-proxy"},
	}
	for _, kp := range pairs {
		if err := p.issue(kp); err != nil {
			return err
		}
	}
	return p.serviceAccountKey()
}

// importImages imports the pause image (built once into the state dir) and the tarballs
// in Options.ImagesDir.
func (c *Cluster) importImages(ctx context.Context) error {
	imgDir := filepath.Join(c.opts.StateDir, "images")
	pause := filepath.Join(imgDir, images.TarName(images.PauseImage))
	if _, err := os.Stat(pause); err != nil {
		if pause, err = images.BuildPause(ctx, imgDir); err != nil {
			return fmt.Errorf("building the pause image: %w", err)
		}
	}
	tars := []string{pause}
	if c.opts.ImagesDir != "" {
		more, err := filepath.Glob(filepath.Join(c.opts.ImagesDir, "*.tar"))
		if err != nil {
			return err
		}
		sort.Strings(more)
		for _, m := range more {
			if filepath.Base(m) != filepath.Base(pause) {
				tars = append(tars, m)
			}
		}
	}
	for _, t := range tars {
		t0 := time.Now()
		if err := c.ImportImage(ctx, t); err != nil {
			return err
		}
		c.logf("imported %s in %s", filepath.Base(t), time.Since(t0).Round(10*time.Millisecond))
	}
	return nil
}

// waitFor polls check until it succeeds, failing early when a component has exited.
func (c *Cluster) waitFor(ctx context.Context, what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		for name, ch := range c.exited {
			select {
			case <-ch:
				return fmt.Errorf("waiting for %s: %s exited; its log:\n%s", what, name, TailFile(filepath.Join(c.logDir, name+".log"), 30))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not reached after %s: %v (logs in %s)", what, timeout, last, c.logDir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TailFile is the last n lines of the file at path (a component's log, say), or why it
// could not be read.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Status describes the recorded node: each process and whether it runs, and the node's
// readiness as the apiserver reports it.
func (c *Cluster) Status(ctx context.Context) (string, bool) {
	var b strings.Builder
	healthy := true
	fmt.Fprintf(&b, "state dir: %s\napiserver: %s\nkubeconfig: %s\n", c.opts.StateDir, c.j.APIServer, c.kubeconfig)
	for _, p := range c.j.Processes {
		state := "running"
		if !p.alive() {
			state, healthy = "NOT RUNNING", false
		}
		fmt.Fprintf(&b, "  %-24s pid %-7d %s\n", p.Name, p.Pid, state)
	}
	cfg, err := c.RESTConfig()
	if err == nil {
		cfg.Timeout = 5 * time.Second
		var cs *kubernetes.Clientset
		if cs, err = kubernetes.NewForConfig(cfg); err == nil {
			var node *corev1.Node
			if node, err = cs.CoreV1().Nodes().Get(ctx, c.j.Hostname, metav1.GetOptions{}); err == nil {
				ready := "unknown"
				for _, cond := range node.Status.Conditions {
					if cond.Type == corev1.NodeReady {
						ready = string(cond.Status)
					}
				}
				fmt.Fprintf(&b, "node %s Ready=%s\n", node.Name, ready)
				healthy = healthy && ready == "True"
			}
		}
	}
	if err != nil {
		healthy = false
		if apierrors.IsNotFound(err) {
			fmt.Fprintf(&b, "node %s not registered\n", c.j.Hostname)
		} else {
			fmt.Fprintf(&b, "apiserver: %v\n", err)
		}
	}
	return b.String(), healthy
}

// Down stops every process the node started, removes its pods, and puts back what it
// changed on the host: sysctls, iptables chains, mounts, network devices, cgroups, the
// /etc/hosts line and host paths it created. It leaves alone anything it did not create,
// and it can be called again after a partial failure.
func (c *Cluster) Down(ctx context.Context) error {
	if c.j == nil {
		return nil
	}
	var errs []error
	byName := map[string]procRecord{}
	for _, p := range c.j.Processes {
		byName[p.Name] = p
	}
	// Controllers first so nothing recreates pods, then the kubelet so nothing restarts them.
	for _, name := range []string{"kube-controller-manager", "kube-scheduler", "kubelet"} {
		if p, ok := byName[name]; ok {
			if err := stopProcess(p, 10*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if p, ok := byName["containerd"]; ok && p.alive() {
		if err := removeAllPods(ctx, c.containerdSocket); err != nil {
			errs = append(errs, fmt.Errorf("removing pods: %w", err))
		}
	}
	for _, name := range []string{"containerd", "kube-apiserver", "etcd"} {
		if p, ok := byName[name]; ok {
			if err := stopProcess(p, 10*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Everything else the node started, the API server's forwarder (socat) among them, with
	// what it forked for its connections: those share its process group, which Setsid made
	// its own. The group's id cannot be reused while a member lives, so the last SIGKILL
	// reaches only what the node started.
	for _, p := range c.j.Processes {
		if !p.alive() {
			continue
		}
		_ = syscall.Kill(-p.Pid, syscall.SIGTERM)
		if err := stopProcess(p, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	}
	// Shims and container processes outlive containerd: stop what is left in the pod
	// cgroups the kubelet created, then the shims of this node's containerd.
	for _, cg := range c.j.Cgroups {
		for _, pid := range cgroupProcs(cg) {
			if st, err := startTime(pid); err == nil {
				_ = stopProcess(procRecord{Name: "pod process", Pid: pid, Start: st}, 2*time.Second)
			}
		}
	}
	for _, shim := range shimsOf(c.containerdSocket + ".ttrpc") {
		_ = stopProcess(shim, 2*time.Second)
	}
	for _, shim := range shimsOf(c.containerdSocket) {
		_ = stopProcess(shim, 2*time.Second)
	}

	// Mounts: everything under the state dir, and network namespaces made while it ran.
	prefixes := append([]string{c.opts.StateDir}, c.j.Paths...)
	existedNetns := map[string]bool{}
	for _, n := range c.j.Netns {
		existedNetns[n] = true
	}
	var newNetns []string
	for _, n := range listNetns() {
		if !existedNetns[n] && strings.HasPrefix(n, "cni-") {
			newNetns = append(newNetns, filepath.Join("/run/netns", n))
		}
	}
	prefixes = append(prefixes, newNetns...)
	errs = append(errs, unmountAll(prefixes...)...)
	for _, n := range newNetns {
		if err := os.Remove(n); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", n, err))
		}
	}

	errs = append(errs, removeNewChains(c.j.Chains)...)
	for _, link := range c.j.Links {
		if _, err := net.InterfaceByName(link); err == nil {
			if out, err := exec.Command("ip", "link", "del", link).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("ip link del %s: %w: %s", link, err, out))
			}
		}
	}
	// After the bridge is gone: the bridge plugin turns forwarding on.
	errs = append(errs, restoreSysctls(c.j.Sysctls)...)
	if c.j.HostsLine != "" {
		if err := removeHostsLine(c.j.HostsLine); err != nil {
			errs = append(errs, fmt.Errorf("removing %q from /etc/hosts: %w", c.j.HostsLine, err))
		}
	}
	for _, cg := range c.j.Cgroups {
		if err := removeCgroupTree(cg); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range c.j.Paths {
		if mps, _ := mountsUnder(p); len(mps) > 0 {
			errs = append(errs, fmt.Errorf("not removing %s: still mounted: %v", p, mps))
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	if mps, _ := mountsUnder(c.opts.StateDir); len(mps) == 0 {
		if err := os.RemoveAll(c.runDir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", c.runDir, err))
		}
		_ = os.Remove(c.kubeconfig)
	}
	if err := errors.Join(errs...); err != nil {
		// Keep the journal so that another Down can finish the job.
		return fmt.Errorf("stopping the local node (run `localnode down` again to retry): %w", err)
	}
	if err := os.Remove(c.journalPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", c.journalPath(), err)
	}
	c.unlock()
	c.logf("node stopped and host restored")
	return nil
}

func (c *Cluster) unlock() {
	if c.lock != nil && c.ownsLock {
		_ = c.lock.Close()
		c.lock = nil
	}
}
