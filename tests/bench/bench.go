// Package bench measures the operator from outside, for N jobs in flight: jobs per
// second, the latency of each step of a job from its creation to the finish Buildkite
// receives, the API server's requests per job by client (its audit log), the CPU each
// process used per job (/proc), and agentd's memory, beside a bare pod's start in the same
// run as the floor of every pod-start latency. Jobs are all queued at once (the closed
// loop: N run, the rest wait) or arrive at a set rate (the open loop). cmd/bench runs it;
// docs/performance.md has results.
//
// Two backends run the pods. "kwok" is a real kube-apiserver and kube-scheduler with one
// node simulated by kwok: pods start without running anything, and the bench stands in
// for the in-pod supervisor (see standIn), so that 1000 jobs fit on a small machine.
// "node" is the local single-node Kubernetes of tests/cluster (root), where pods really
// run `agentd supervise`.
package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// Backends.
const (
	BackendKwok = "kwok"
	BackendNode = "node"
)

// namespace holds the operator's Secrets, the BuildJobs, their pods and the bare pods.
const namespace = harness.DefaultNamespace

// Config is one run.
type Config struct {
	// Backend is BackendKwok or BackendNode.
	Backend string
	// InFlight is the operator's slots: the most jobs in flight.
	InFlight int
	// Rounds: a run has InFlight × Rounds jobs, so each slot runs Rounds jobs.
	Rounds int
	// Jobs, when set, is how many jobs the run queues in place of InFlight × Rounds.
	Jobs int
	// Rate, when above 0, makes the run an open loop: one job arrives every 1/Rate
	// seconds, a build of its own, instead of all at once.
	Rate float64
	// SampleEvery is how often agentd's memory and the run's progress are sampled.
	SampleEvery time.Duration
	// CommandDuration is how long each job's command runs.
	CommandDuration time.Duration
	// Timeout bounds the jobs, from the last one queued to the last finish.
	Timeout time.Duration
	// Agentd is the agentd binary run as the operator; built into Dir when empty.
	Agentd string
	// OperatorArgs are added to `agentd operator`'s command line.
	OperatorArgs []string
	// OperatorEnv (NAME=value) is added to `agentd operator`'s environment only, such as
	// GOMEMLIMIT as the chart sets it: the bench's environment reaches every component.
	OperatorEnv []string
	// Dir keeps the run's logs, kubeconfigs and audit log; a temporary folder when empty,
	// removed after a run that succeeded.
	Dir string
	// Kwok, KubeScheduler and KubeControllerManager are the kwok backend's binaries
	// (KwokBinary, SchedulerBinary, ControllerManagerBinary).
	Kwok, KubeScheduler, KubeControllerManager string
	// ImagesDir holds the image tarballs the node backend imports (make images).
	ImagesDir string
	// NodeWait is how long the node backend waits for another local node to stop.
	NodeWait time.Duration
	// Warm adds the warm-pool phase after the closed loop's jobs (warmPhase), with a pool of
	// WarmPoolSize pods, at most bkv1.WarmPoolMaxSize. agentd then runs with its webhook
	// server, which serves the hand-off endpoint, in both phases.
	Warm bool
	// Logf receives progress messages.
	Logf func(string, ...any)
}

func (c *Config) defaults() error {
	switch c.Backend {
	case BackendKwok, BackendNode:
	default:
		return fmt.Errorf("unknown backend %q: use %s or %s", c.Backend, BackendKwok, BackendNode)
	}
	if c.InFlight <= 0 {
		return fmt.Errorf("jobs in flight must be at least 1, not %d", c.InFlight)
	}
	c.Rounds = max(c.Rounds, 1)
	if c.Jobs <= 0 {
		c.Jobs = c.InFlight * c.Rounds
	}
	if c.Rate < 0 {
		return fmt.Errorf("the arrival rate must be positive (jobs per second), or 0 for all at once, not %g", c.Rate)
	}
	if err := c.checkWarm(); err != nil {
		return err
	}
	if c.SampleEvery <= 0 {
		c.SampleEvery = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Minute
	}
	if c.Kwok == "" {
		c.Kwok = KwokBinary()
	}
	if c.KubeScheduler == "" {
		c.KubeScheduler = SchedulerBinary()
	}
	if c.KubeControllerManager == "" {
		c.KubeControllerManager = ControllerManagerBinary()
	}
	if c.ImagesDir == "" {
		c.ImagesDir = filepath.Join(testkit.RepoRoot(), ".cache", "images")
	}
	if c.NodeWait <= 0 {
		c.NodeWait = 30 * time.Minute
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// clusterEnv is a running backend.
type clusterEnv struct {
	// rest is an admin client configuration; the bench's clients add their user agent.
	rest               *rest.Config
	operatorKubeconfig string
	auditLog           string
	// fakeAddr is where the fake Buildkite listens: an address pods reach.
	fakeAddr string
	// hostAddress is this host's address as the node's pods reach it (the node backend's).
	hostAddress   string
	jobImage      string
	pullPolicy    corev1.PullPolicy
	operatorImage string
	// simulated: no container runs, and the bench stands in for the supervisor.
	simulated bool
	// limits are the client limits of the backend's components.
	limits []ClientLimit
	stop   func(context.Context) error
}

// BuildAgentd builds agentd from this module into dir.
func BuildAgentd(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "agentd")
	// As `make release-binaries` builds it for the image: static and stripped, which is
	// what a cluster runs, and its size shows in the RSS.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "./cmd/agentd")
	cmd.Dir = testkit.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building agentd: %w: %s", err, b)
	}
	return out, nil
}

// Run runs the bench once and returns its result.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		if cfg.Dir, err = os.MkdirTemp("", "bench-"); err != nil {
			return nil, err
		}
		defer func() {
			if err == nil {
				_ = os.RemoveAll(cfg.Dir)
			} else {
				err = fmt.Errorf("%w (logs in %s)", err, cfg.Dir)
			}
		}()
	} else if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if cfg.Agentd == "" {
		cfg.Logf("building agentd")
		if cfg.Agentd, err = BuildAgentd(ctx, cfg.Dir); err != nil {
			return nil, err
		}
	}
	res = &Result{
		Backend: cfg.Backend, Mode: ModeClosed, InFlight: cfg.InFlight, Jobs: cfg.Jobs, Started: time.Now(), Machine: machine(),
		Limits: []ClientLimit{operatorLimit(cfg.Agentd, cfg.OperatorArgs, cfg.OperatorEnv), benchLimit()},
	}
	if cfg.Rate > 0 {
		res.Mode, res.Rate = ModeOpen, cfg.Rate
	}

	cfg.Logf("starting the %s backend", cfg.Backend)
	var ce *clusterEnv
	if cfg.Backend == BackendKwok {
		ce, err = startKwok(ctx, &cfg)
	} else {
		ce, err = startNode(ctx, &cfg)
	}
	if err != nil {
		return nil, err
	}
	res.Limits = append(res.Limits, ce.limits...)
	defer func() {
		cfg.Logf("stopping the %s backend", cfg.Backend)
		err = errors.Join(err, ce.stop(context.WithoutCancel(ctx)))
	}()
	r := &run{cfg: cfg, ce: ce, res: res}
	return res, r.run(ctx)
}

// run is one run in progress.
type run struct {
	cfg  Config
	ce   *clusterEnv
	res  *Result
	c    client.Client
	fake *fakebuildkite.Server
	w    *watcher
	sup  *standIn
	op   *child
	// metricsAddr serves the operator's Prometheus metrics.
	metricsAddr string
	// webhookPort is agentd's webhook server's, with the warm phase: the hand-off endpoint's.
	webhookPort int
	// logs reads the node's warm pods' logs, and askingPods are those found asking for a
	// job (nodeAsking).
	logs       kubernetes.Interface
	askingPods map[types.UID]bool
}

// The bench's own clients' rate limit: high enough never to be what the run waits for.
const (
	benchQPS   = 1000
	benchBurst = 2000
)

// benchREST is the bench's own client configuration: its user agent names it in the
// audit log.
func benchREST(base *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.UserAgent = "bench"
	cfg.QPS, cfg.Burst = benchQPS, benchBurst
	return cfg
}

func (r *run) run(ctx context.Context) (err error) {
	cfg := benchREST(r.ce.rest)
	if r.c, err = client.New(cfg, client.Options{Scheme: harness.Scheme()}); err != nil {
		return fmt.Errorf("creating the bench's client: %w", err)
	}
	fakeLog, err := os.Create(filepath.Join(r.cfg.Dir, "fake-buildkite.log"))
	if err != nil {
		return err
	}
	defer func() { _ = fakeLog.Close() }()
	var logMu sync.Mutex
	// Polling: the bench's phases start where a ping hands a job out; streaming's dispatch
	// figures are pkg/spawner's (docs/performance.md, "Streaming dispatch").
	r.fake, err = fakebuildkite.Start(fakebuildkite.Options{Addr: r.ce.fakeAddr, NoStreaming: true, Logf: func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(fakeLog, time.Now().Format(time.RFC3339Nano)+" "+format+"\n", args...)
	}})
	if err != nil {
		return err
	}
	defer func() { _ = r.fake.Close() }()
	if err := r.setup(ctx); err != nil {
		return err
	}
	var onPod, onGone func(*corev1.Pod)
	if r.ce.simulated {
		// Its warm pods wait for jobs until they go: a run that fails ends their waits.
		sctx, stopStandIn := context.WithCancel(ctx)
		defer stopStandIn()
		r.sup = newStandIn(sctx, r.c, r.cfg.CommandDuration, r.cfg.Dir)
		onPod, onGone = r.sup.onPod, r.sup.onPodGone
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if r.w, err = watch(wctx, cfg, namespace, onPod, onGone); err != nil {
		return err
	}

	if r.cfg.Rate > 0 {
		r.cfg.Logf("bare-pod floor: %d pods, %.2f a second", r.cfg.InFlight, r.cfg.Rate)
	} else {
		r.cfg.Logf("bare-pod floor: %d pods at once", r.cfg.InFlight)
	}
	if r.res.BarePod, err = r.barePods(ctx); err != nil {
		return err
	}
	if err := r.startOperator(ctx); err != nil {
		return err
	}
	defer func() {
		if r.op != nil {
			_ = r.op.stop(30 * time.Second)
		}
	}()
	if err := r.jobs(ctx); err != nil || !r.cfg.Warm {
		return err
	}
	return r.warmPhase(ctx)
}

// setup installs the CRDs, the namespace, the registration token Secret and the default
// BuildEnvironment.
func (r *run) setup(ctx context.Context) error {
	if err := harness.InstallCRDs(ctx, r.c); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := r.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", namespace, err)
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: harness.TokenSecret, Namespace: namespace},
		StringData: map[string]string{"token": r.fake.RegistrationToken()},
	}
	if err := r.c.Create(ctx, sec); err != nil {
		return fmt.Errorf("creating the registration token Secret: %w", err)
	}
	env := harness.SampleEnvironments(namespace, r.ce.jobImage, r.ce.pullPolicy)[0]
	// The command under the supervisor, no checkout: the bench measures the operator, not
	// buildkite-agent bootstrap.
	env.Spec.Runner = bkv1.RunnerCommand
	if err := r.c.Create(ctx, env); err != nil {
		return fmt.Errorf("creating BuildEnvironment %s: %w", env.Name, err)
	}
	if r.cfg.Warm {
		return r.setupWarm(ctx)
	}
	return nil
}
