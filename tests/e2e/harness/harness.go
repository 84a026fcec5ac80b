// Package harness brings up everything a job needs to run on real pods: a Kubernetes node
// (the local one from tests/cluster, or a cluster the caller already has), the fake
// Buildkite on an address the pods can reach, the CRDs, sample BuildEnvironments, and
// `agentd operator` as a real process that can be killed and restarted. The end-to-end
// suite and the demo share it.
package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// DefaultNamespace is where the operator and its own Secrets live unless Options.Namespace
// says otherwise; its BuildJobs, BuildEnvironments and job pods live in the job namespace,
// <namespace>-jobs, as the chart makes it.
const DefaultNamespace = "buildkite"

// JobNamespaceFor is the job namespace of an operator installed in namespace: the chart's
// default.
func JobNamespaceFor(namespace string) string { return namespace + "-jobs" }

// TokenSecret holds the fake's registration token for the operator, so that the token is
// never written to a file or a command line.
const TokenSecret = "buildkite-agent-token"

// Options configures Start.
type Options struct {
	// Namespace of the operator and its Secrets; default DefaultNamespace. Its BuildJobs,
	// BuildEnvironments and job pods live in JobNamespaceFor(Namespace). Two Envs on one
	// cluster need different namespaces.
	Namespace string
	// Kubeconfig, when set, is an existing cluster to use instead of starting the local
	// node. Its pods must be able to reach AdvertiseHost and to use JobImage and
	// OperatorImage.
	Kubeconfig string
	// StateDir holds the local node's state, the operator's log and other files.
	StateDir string
	// ImagesDir holds the image tarballs imported into the local node; default
	// <repo>/.cache/images.
	ImagesDir string
	// Agentd is the agentd binary run as the operator.
	Agentd string
	// FakeAddr is the fake Buildkite's listen address. Default: the bridge gateway of the
	// local node on a free port; with Kubeconfig, 0.0.0.0 on a free port.
	FakeAddr string
	// AdvertiseHost is the host name or address pods use to reach the fake when it
	// listens on all interfaces. Default: the host's first non-loopback address.
	AdvertiseHost string
	// MinuteDuration is how long a minute of timeout_in_minutes lasts in the fake.
	MinuteDuration time.Duration
	// Spawn is the operator's number of slots (jobs in flight). Default 4.
	Spawn int
	// JobImage and OperatorImage name the images; defaults are the locally built ones.
	JobImage, OperatorImage string
	// JobImagePullPolicy of the sample BuildEnvironments; default Never (imported images).
	JobImagePullPolicy corev1.PullPolicy
	// OperatorArgs are added to the operator's command line (through the chart's
	// operator.extraArgs when it runs in the cluster).
	OperatorArgs []string
	// HostProcess runs `agentd operator` as a process on this machine with the
	// kubeconfig's credentials, webhooks and leader election off, instead of installing the
	// chart: for a cluster whose nodes cannot load the locally built image.
	HostProcess bool
	// Logf receives progress messages.
	Logf func(string, ...any)
}

// Env is everything Start brought up.
type Env struct {
	Opts      Options
	Namespace string
	// JobNamespace holds the BuildJobs, BuildEnvironments and job pods.
	JobNamespace string
	Node         *cluster.Cluster // nil when running against an existing cluster
	Kubeconfig   string
	REST         *rest.Config
	Client       client.Client
	Fake         *fakebuildkite.Server
	// Operator is the running operator, whichever way it runs: Release when it is installed
	// in the cluster by its chart (the default), Process when it runs on the host.
	Operator OperatorHandle
	Release  *Release
	Process  *Operator
	// Timings of the start, for reports.
	NodeStart, Total time.Duration
}

func (o *Options) defaults() error {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.StateDir == "" {
		o.StateDir = cluster.DefaultStateDir()
	}
	if o.ImagesDir == "" {
		o.ImagesDir = filepath.Join(testkit.RepoRoot(), ".cache", "images")
	}
	if o.Agentd == "" {
		o.Agentd = filepath.Join(testkit.RepoRoot(), "bin", "agentd")
	}
	if o.Spawn <= 0 {
		o.Spawn = 4
	}
	if o.JobImage == "" {
		o.JobImage = images.JobImage
	}
	if o.OperatorImage == "" {
		o.OperatorImage = images.AgentdImage
	}
	if o.JobImagePullPolicy == "" {
		o.JobImagePullPolicy = corev1.PullNever
	}
	if _, err := os.Stat(o.Agentd); err != nil {
		return fmt.Errorf("agentd binary %s: %w (build it with `make build`)", o.Agentd, err)
	}
	return os.MkdirAll(o.StateDir, 0o755)
}

// Start brings everything up. On error, what was started is stopped again.
func Start(ctx context.Context, opts Options) (env *Env, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	// The client's log: the API server's warnings about what the tests write (the
	// operator's webhooks give some) go to the harness's log, not to a stack dump.
	ctrllog.SetLogger(funcr.New(func(prefix, args string) { opts.Logf("kubernetes client: %s %s", prefix, args) }, funcr.Options{}))
	t0 := time.Now()
	env = &Env{Opts: opts, Namespace: opts.Namespace, JobNamespace: JobNamespaceFor(opts.Namespace)}
	defer func() {
		if err != nil {
			_ = env.Stop(context.WithoutCancel(ctx))
			env = nil
		}
	}()

	if opts.Kubeconfig == "" {
		opts.Logf("starting the local node (state in %s)", opts.StateDir)
		node, err := cluster.Up(ctx, cluster.Options{StateDir: opts.StateDir, ImagesDir: opts.ImagesDir, Logf: opts.Logf})
		if err != nil {
			return env, fmt.Errorf("starting the local node: %w", err)
		}
		env.Node = node
		env.Kubeconfig = node.Kubeconfig()
		env.NodeStart = time.Since(t0)
		opts.Logf("local node ready in %s", env.NodeStart.Round(time.Millisecond))
	} else {
		env.Kubeconfig = opts.Kubeconfig
	}
	env.REST, err = clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		return env, fmt.Errorf("reading kubeconfig %s: %w", env.Kubeconfig, err)
	}
	// Twenty jobs at once make many requests; client-go's default of 5 qps would queue them.
	env.REST.QPS, env.REST.Burst = 50, 100
	env.Client, err = client.New(env.REST, client.Options{Scheme: Scheme()})
	if err != nil {
		return env, fmt.Errorf("creating a client: %w", err)
	}

	fakeAddr, advertise := opts.FakeAddr, ""
	if fakeAddr == "" {
		if env.Node != nil {
			fakeAddr = net.JoinHostPort(env.Node.HostAddress(), "0")
		} else {
			fakeAddr = "0.0.0.0:0"
		}
	}
	if host, _, _ := net.SplitHostPort(fakeAddr); host == "" || net.ParseIP(host).IsUnspecified() {
		advertise = opts.AdvertiseHost
		if advertise == "" {
			if advertise, err = outboundAddress(); err != nil {
				return env, err
			}
		}
	}
	env.Fake, err = fakebuildkite.Start(fakebuildkite.Options{Addr: fakeAddr, MinuteDuration: opts.MinuteDuration, Logf: opts.Logf})
	if err != nil {
		return env, err
	}
	if advertise != "" {
		_, port, _ := net.SplitHostPort(env.Fake.URL()[len("http://"):])
		env.Fake.SetBaseURL("http://" + net.JoinHostPort(advertise, port))
	}
	opts.Logf("fake Buildkite at %s", env.Fake.URL())

	if err := InstallCRDs(ctx, env.Client); err != nil {
		return env, err
	}
	if err := env.setupNamespace(ctx); err != nil {
		return env, err
	}
	if opts.HostProcess {
		if err := env.createJobNamespace(ctx); err != nil {
			return env, err
		}
		err = env.startProcess(opts)
	} else {
		err = env.install(ctx, opts)
	}
	if err != nil {
		return env, err
	}
	if opts.HostProcess {
		if err := env.admitHostPaths(ctx); err != nil {
			return env, err
		}
	}
	for _, be := range SampleEnvironments(env.JobNamespace, opts.JobImage, opts.JobImagePullPolicy) {
		if err := env.ApplyEnvironment(ctx, be); err != nil {
			return env, err
		}
	}
	if err := env.WaitAgents(ctx, opts.Spawn, 2*time.Minute); err != nil {
		return env, err
	}
	env.Total = time.Since(t0)
	opts.Logf("operator connected %d agents; everything up in %s", opts.Spawn, env.Total.Round(time.Millisecond))
	return env, nil
}

// OperatorHandle is what the tests and the demo need of a running operator.
type OperatorHandle interface {
	Running() bool
	// Tail is the last n lines of its log.
	Tail(n int) string
	// LogHint says where its whole log is.
	LogHint() string
}

// install installs the operator's Helm chart with the locally built image, as a user would.
func (e *Env) install(ctx context.Context, opts Options) error {
	values := append(e.ImageValues(), e.ReleaseValues(e.JobNamespace, "", opts.Spawn)...)
	if len(opts.OperatorArgs) > 0 {
		extra, err := json.Marshal(opts.OperatorArgs)
		if err != nil {
			return err
		}
		values = append(values, "--set-json", "operator.extraArgs="+string(extra))
	}
	cs, err := kubernetes.NewForConfig(e.REST)
	if err != nil {
		return fmt.Errorf("creating a clientset: %w", err)
	}
	e.Release = &Release{Namespace: e.Namespace, Kubeconfig: e.Kubeconfig, Values: values, cs: cs, AfterApply: e.admitHostPaths}
	e.Operator = e.Release
	opts.Logf("installing the chart (image %s)", opts.OperatorImage)
	t0 := time.Now()
	if err := e.Release.Install(ctx); err != nil {
		return fmt.Errorf("%w\nthe operator's pods:\n%s", err, e.Release.Tail(40))
	}
	opts.Logf("chart installed, operator ready in %s", time.Since(t0).Round(time.Millisecond))
	return nil
}

// ImageValues are the --set arguments that give the chart the locally built operator image.
func (e *Env) ImageValues() []string {
	repo, tag, _ := strings.Cut(e.Opts.OperatorImage, ":")
	return []string{"--set", "image.repository=" + repo, "--set", "image.tag=" + tag}
}

// ReleaseValues are the --set arguments, the operator image aside (ImageValues), that
// install the chart as the suite does: the fake Buildkite, its token from TokenSecret (make
// it in the release's namespace with CreateTokenSecret), slots agents on queue (the chart's
// default when empty), jobs in jobNamespace, and "default" as the default environment.
func (e *Env) ReleaseValues(jobNamespace, queue string, slots int) []string {
	values := []string{
		"--set", "image.pullPolicy=IfNotPresent",
		"--set", "operator.jobImagePullPolicy=IfNotPresent",
		"--set", "buildkite.agentEndpoint=" + e.Fake.Endpoint(),
		"--set", "buildkite.registrationTokenSecret.name=" + TokenSecret,
		"--set", "buildkite.slots=" + strconv.Itoa(slots),
		"--set", "buildkite.defaultBuildEnvironment=default",
		"--set", "jobNamespace.name=" + jobNamespace,
	}
	if queue != "" {
		values = append(values, "--set", "buildkite.queue="+queue)
	}
	return values
}

// startProcess runs `agentd operator` on this machine with the kubeconfig's credentials.
func (e *Env) startProcess(opts Options) error {
	e.Process = &Operator{
		Bin:     opts.Agentd,
		LogPath: filepath.Join(opts.StateDir, "agentd-operator.log"),
		Env:     []string{"KUBECONFIG=" + e.Kubeconfig},
		Args: append([]string{
			"--namespace", opts.Namespace,
			"--job-namespace", e.JobNamespace,
			"--agent-endpoint", e.Fake.Endpoint(),
			"--registration-token-secret", TokenSecret,
			"--slots", strconv.Itoa(opts.Spawn),
			"--operator-image", opts.OperatorImage,
			"--default-build-environment", "default",
			"--webhooks=false",
			"--leader-elect=false",
			"--metrics-bind-address", "0",
			"--health-probe-bind-address", "0",
		}, opts.OperatorArgs...),
	}
	e.Operator = e.Process
	return e.Process.Start()
}

// WaitAgents waits until n agents are connected to the fake.
func (e *Env) WaitAgents(ctx context.Context, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	exited := false
	err := e.Fake.WaitFor(ctx, func() bool {
		if !e.Operator.Running() {
			exited = true
			return true
		}
		return e.Fake.ConnectedAgents() >= n
	})
	if exited {
		return fmt.Errorf("the operator exited before its %d agents connected; its log (%s) ends:\n%s", n, e.Operator.LogHint(), e.Operator.Tail(40))
	}
	if err != nil {
		return fmt.Errorf("waiting for the operator's %d agents to connect to the fake Buildkite: %w; the operator's log (%s) ends:\n%s",
			n, err, e.Operator.LogHint(), e.Operator.Tail(40))
	}
	return nil
}

func (e *Env) setupNamespace(ctx context.Context) error {
	return e.CreateTokenSecret(ctx, e.Namespace)
}

// CreateTokenSecret makes namespace, if need be, and in it TokenSecret with the fake's
// registration token, for a release installed there.
func (e *Env) CreateTokenSecret(ctx context.Context, namespace string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := e.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: TokenSecret, Namespace: namespace},
		StringData: map[string]string{"token": e.Fake.RegistrationToken()},
	}
	if err := e.Client.Create(ctx, sec); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Secret %s/%s: %w", namespace, TokenSecret, err)
		}
		if err := e.Client.Update(ctx, sec); err != nil {
			return fmt.Errorf("updating Secret %s/%s: %w", namespace, TokenSecret, err)
		}
	}
	return nil
}

// createJobNamespace makes the job namespace as the chart would, for an operator that runs
// on the host.
func (e *Env) createJobNamespace(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.JobNamespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
		"pod-security.kubernetes.io/warn":    "restricted",
	}}}
	if err := e.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", e.JobNamespace, err)
	}
	return nil
}

// admitHostPaths lets Pod Security admission in the job namespace accept the suite's
// hostPath volumes (its git repositories and barriers), which no level but privileged
// allows. Only admission is relaxed: the operator still builds every pod for the restricted
// level, as installed by default, so the jobs run as they would for users (uid 1000, no
// capabilities); the warn and audit labels stay restricted.
func (e *Env) admitHostPaths(ctx context.Context) error {
	ns := &corev1.Namespace{}
	if err := e.Client.Get(ctx, client.ObjectKey{Name: e.JobNamespace}, ns); err != nil {
		return fmt.Errorf("reading the job namespace %s: %w", e.JobNamespace, err)
	}
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		return fmt.Errorf("the job namespace %s enforces Pod Security level %q, want restricted as the chart installs it", e.JobNamespace, got)
	}
	patch := client.MergeFrom(ns.DeepCopy())
	ns.Labels["pod-security.kubernetes.io/enforce"] = "privileged"
	if err := e.Client.Patch(ctx, ns, patch); err != nil {
		return fmt.Errorf("labelling the job namespace %s: %w", e.JobNamespace, err)
	}
	return nil
}

// Stop stops the operator, the fake and the local node, in that order, and reports every
// failure.
func (e *Env) Stop(ctx context.Context) error {
	var errs []error
	if e.Process != nil {
		if err := e.Process.Stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if e.Fake != nil {
		if err := e.Fake.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the fake Buildkite: %w", err))
		}
	}
	if e.Node != nil {
		e.Opts.Logf("stopping the local node")
		if err := e.Node.Down(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// outboundAddress is this host's address on its default route, which pods of a cluster
// elsewhere can usually reach.
func outboundAddress() (string, error) {
	ifaces, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("listing the host's addresses: %w", err)
	}
	for _, a := range ifaces {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", errors.New("the host has no non-loopback IPv4 address for pods to reach the fake Buildkite: pass an advertise address")
}
