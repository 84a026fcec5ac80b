// Package bench measures the operator from outside, for N jobs in flight: jobs per
// second, the latency of each step of a job from the ping that hands it out to the finish
// Buildkite receives, the API server's requests per job by client (its audit log), and
// agentd's peak memory and CPU per job, beside a bare pod's start in the same run as the
// floor of every pod-start latency. cmd/bench runs it; docs/performance.md has results.
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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// Rounds: InFlight × Rounds jobs are queued at once, so each slot runs Rounds jobs.
	Rounds int
	// CommandDuration is how long each job's command runs.
	CommandDuration time.Duration
	// Timeout bounds the jobs, from the first build to the last finish.
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
	// Kwok and KubeScheduler are the kwok backend's binaries (KwokBinary, SchedulerBinary).
	Kwok, KubeScheduler string
	// ImagesDir holds the image tarballs the node backend imports (make images).
	ImagesDir string
	// NodeWait is how long the node backend waits for another local node to stop.
	NodeWait time.Duration
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
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Minute
	}
	if c.Kwok == "" {
		c.Kwok = KwokBinary()
	}
	if c.KubeScheduler == "" {
		c.KubeScheduler = SchedulerBinary()
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
	fakeAddr      string
	jobImage      string
	pullPolicy    corev1.PullPolicy
	operatorImage string
	// simulated: no container runs, and the bench stands in for the supervisor.
	simulated bool
	stop      func(context.Context) error
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
	res = &Result{Backend: cfg.Backend, InFlight: cfg.InFlight, Jobs: cfg.InFlight * cfg.Rounds, Started: time.Now(), Machine: machine()}

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
}

// benchREST is the bench's own client configuration: its user agent names it in the
// audit log, and its rate limit is high enough never to be what the run waits for.
func benchREST(base *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.UserAgent = "bench"
	cfg.QPS, cfg.Burst = 1000, 2000
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
	var onPod func(*corev1.Pod)
	if r.ce.simulated {
		r.sup = newStandIn(ctx, r.c, r.cfg.CommandDuration)
		onPod = r.sup.onPod
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if r.w, err = watch(wctx, cfg, namespace, onPod); err != nil {
		return err
	}

	r.cfg.Logf("bare-pod floor: %d pods at once", r.cfg.InFlight)
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
	return r.jobs(ctx)
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
	return nil
}

// barePods is the floor: N pods with the job image and nothing of the operator's, created
// at once; each one's create → running as the watch sees it, as for the jobs' pods.
func (r *run) barePods(ctx context.Context) (Stats, error) {
	n := r.cfg.InFlight
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	errs := make(chan error, n)
	zero := int64(0)
	for i := range n {
		go func() {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bare-%d", i), Namespace: namespace, Labels: map[string]string{bareLabel: "true"}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: &zero,
					Containers: []corev1.Container{{
						Name: "bare", Image: r.ce.jobImage, ImagePullPolicy: r.ce.pullPolicy,
						Command: []string{"sleep", "3600"},
					}},
				},
			}
			errs <- r.c.Create(ctx, pod)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return Stats{}, fmt.Errorf("creating a bare pod: %w", err)
		}
	}
	err := r.w.waitFor(ctx, "the bare pods to run", func() bool {
		running := 0
		for _, o := range r.w.bare {
			if !o.podRunning.IsZero() {
				running++
			}
		}
		return running == n
	})
	if err != nil {
		return Stats{}, err
	}
	var ds []time.Duration
	r.w.mu.Lock()
	for _, o := range r.w.bare {
		ds = append(ds, o.podRunning.Sub(o.podCreated))
	}
	r.w.mu.Unlock()
	err = r.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(namespace), client.MatchingLabels{bareLabel: "true"}, client.GracePeriodSeconds(0))
	if err != nil {
		return Stats{}, fmt.Errorf("deleting the bare pods: %w", err)
	}
	if err := r.w.waitFor(ctx, "the bare pods to be gone", func() bool { return len(r.w.barePods) == 0 }); err != nil {
		return Stats{}, err
	}
	return percentiles(ds), nil
}

// startOperator runs `agentd operator` with InFlight slots and waits for them to connect.
func (r *run) startOperator(ctx context.Context) error {
	var err error
	if r.metricsAddr, err = freeAddr(); err != nil {
		return err
	}
	args := append([]string{
		"operator",
		"--namespace", namespace,
		"--agent-endpoint", r.fake.Endpoint(),
		"--registration-token-secret", harness.TokenSecret,
		"--slots", strconv.Itoa(r.cfg.InFlight),
		"--operator-image", r.ce.operatorImage,
		"--default-build-environment", "default",
		// As the end-to-end suite runs it on the host: one replica, no webhooks.
		"--webhooks=false",
		"--leader-elect=false",
		"--metrics-bind-address", r.metricsAddr,
		"--health-probe-bind-address", "0",
	}, r.cfg.OperatorArgs...)
	if r.op, err = startChild("agentd-operator", r.cfg.Dir, r.cfg.Agentd, args, append([]string{"KUBECONFIG=" + r.ce.operatorKubeconfig}, r.cfg.OperatorEnv...)); err != nil {
		return err
	}
	r.cfg.Logf("waiting for the operator's %d slots to connect", r.cfg.InFlight)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute+time.Duration(r.cfg.InFlight)*time.Second)
	defer cancel()
	err = r.fake.WaitFor(wctx, func() bool {
		if !r.op.running() {
			return true
		}
		return r.fake.ConnectedAgents() >= r.cfg.InFlight
	})
	if !r.op.running() {
		return fmt.Errorf("the operator exited before its slots connected; its log ends:\n%s", r.op.tail())
	}
	if err != nil {
		return fmt.Errorf("waiting for the operator's %d slots to connect: %w; its log ends:\n%s", r.cfg.InFlight, err, r.op.tail())
	}
	return nil
}

// buildSize is how many steps each of the bench's builds has.
const buildSize = 50

// jobs queues InFlight × Rounds jobs at once, waits for them to finish and their pods to
// go, and fills in the result.
func (r *run) jobs(ctx context.Context) error {
	total := r.res.Jobs
	command := "echo bench"
	if !r.ce.simulated && r.cfg.CommandDuration > 0 {
		command += fmt.Sprintf(" && sleep %g", r.cfg.CommandDuration.Seconds())
	}
	cpu0, err := r.op.cpuTime()
	if err != nil {
		return err
	}
	metrics0, err := scrape(ctx, r.metricsAddr)
	if err != nil {
		return err
	}
	r.cfg.Logf("queueing %d jobs", total)
	from := time.Now()
	var ids []string
	for first := 0; first < total; first += buildSize {
		var b strings.Builder
		b.WriteString("steps:\n")
		for i := first; i < min(first+buildSize, total); i++ {
			fmt.Fprintf(&b, "  - label: \"bench %d\"\n    command: %q\n    agents:\n      queue: bk-operator\n", i, command)
		}
		build, err := r.fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "bench", PipelineYAML: b.String()})
		if err != nil {
			return fmt.Errorf("creating a build: %w", err)
		}
		ids = append(ids, build.Jobs...)
	}

	if err := r.waitJobs(ctx, ids); err != nil {
		return err
	}
	jobs := make([]fakebuildkite.JobSnapshot, 0, len(ids))
	last := from
	for _, id := range ids {
		j, _ := r.fake.Job(id)
		jobs = append(jobs, j)
		if j.ExitStatus == "0" {
			r.res.Passed++
		}
		if j.FinishedAt.After(last) {
			last = j.FinishedAt
		}
	}
	r.res.Seconds = last.Sub(from).Seconds()
	r.res.JobsPerSecond = float64(total) / r.res.Seconds

	// The requests a job causes go on after its finish: the pod is deleted, and the
	// BuildJob's status updated. They are counted until the pods are gone.
	r.cfg.Logf("all %d jobs ended in %.1f s; waiting for their pods to go", total, r.res.Seconds)
	gctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := r.w.waitFor(gctx, "the jobs' pods to be deleted", func() bool { return len(r.w.jobPods) == 0 }); err != nil {
		r.cfg.Logf("%v: counting requests up to now", err)
	}
	to := time.Now()
	cpu1, err := r.op.cpuTime()
	if err != nil {
		return err
	}
	rss, err := r.op.peakRSS()
	if err != nil {
		return err
	}
	metrics1, err := scrape(ctx, r.metricsAddr)
	if err != nil {
		return err
	}
	r.res.Controller = controllerStats(metrics0, metrics1, to.Sub(from), total)
	if err := r.op.stop(30 * time.Second); err != nil {
		return err
	}
	r.res.Agentd = Process{
		PeakRSSMiB:       float64(rss) / (1 << 20),
		CPUSecondsPerJob: (cpu1 - cpu0).Seconds() / float64(total),
		Goroutines:       int(metrics1.sum("go_goroutines", "")),
		HeapInuseMiB:     metrics1.sum("go_memstats_heap_inuse_bytes", "") / (1 << 20),
		StackInuseMiB:    metrics1.sum("go_memstats_stack_inuse_bytes", "") / (1 << 20),
	}
	if ru := r.op.rusage(); ru != nil {
		r.res.Agentd.CPUSecondsTotal = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	r.op = nil

	if r.sup != nil {
		if err := r.sup.wait(); err != nil {
			return fmt.Errorf("the stand-in supervisor: %w", err)
		}
	}
	if r.res.Requests, err = requestsPerJob(r.ce.auditLog, from, to, total); err != nil {
		return err
	}
	r.res.Phases = phases(jobMoments(jobs, r.fake.Requests(), r.w.jobsSeen()))
	r.res.Machine.LoadAfter = loadAverage()
	return nil
}

// waitJobs waits until every job has ended on the fake, or the run's timeout.
func (r *run) waitJobs(ctx context.Context, ids []string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	left := ids
	lastLog := time.Now()
	for len(left) > 0 {
		var still []string
		for _, id := range left {
			if j, ok := r.fake.Job(id); !ok || !fakebuildkite.IsTerminal(j.State) {
				still = append(still, id)
			}
		}
		left = still
		if len(left) == 0 {
			break
		}
		if !r.op.running() {
			return fmt.Errorf("the operator exited with %d jobs unfinished; its log ends:\n%s", len(left), r.op.tail())
		}
		if time.Since(lastLog) > 15*time.Second {
			r.cfg.Logf("%d of %d jobs finished", len(ids)-len(left), len(ids))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			j, _ := r.fake.Job(left[0])
			return fmt.Errorf("%d of %d jobs did not finish within %s (job %s is %s); the operator's log ends:\n%s",
				len(left), len(ids), r.cfg.Timeout, j.ID, j.State, r.op.tail())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// machine describes this machine and checkout.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadBefore: loadAverage()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	cmd := exec.Command("git", "describe", "--always", "--dirty")
	cmd.Dir = testkit.RepoRoot()
	if b, err := cmd.Output(); err == nil {
		m.Commit = strings.TrimSpace(string(b))
	}
	return m
}

// loadAverage is the 1-minute load average (0 when unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
