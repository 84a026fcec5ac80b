// Package soak is the chaos soak: many jobs through `agentd operator` on the local node
// (tests/cluster) while everything around it fails, and a count of what went wrong by
// the four promises of DESIGN.md (harness.AuditJobs defines each measure).
//
// What fails, at random and all at once:
//   - the operator is killed with SIGKILL every KillEvery (5 to 20 s) and started again at
//     once; it also exits by itself when it loses its leader election Lease, and is started
//     again then, as a Deployment would;
//   - a running job pod is deleted every PodDeleteEvery (its job may fail: it is "disturbed"),
//     and an idle warm pod every WarmPodDeleteEvery (no job may suffer);
//   - the fake Buildkite answers requests to the agent API with 5xx, 429 with Retry-After, or
//     drops the connection, on the endpoints the spawner, the controller and the supervisor
//     use;
//   - the operator reaches the API server through Proxy, which delays connections and
//     requests, cuts open connections (watches included) every APICutEvery, and now and
//     then stops all traffic for a few seconds before cutting everything (an outage).
//
// The operator runs as a process on this machine, because the soak kills it with SIGKILL
// itself: with leader election on (short timings, so that a killed leader's successor
// starts within seconds), the chart's ServiceAccount permissions (impersonated through the
// kubeconfig), and its admission webhooks, which the API server calls on the host through
// the chart's webhook Service (hostWebhooks).
package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// Span is a range of durations; a random one is drawn from it each time.
type Span struct{ Min, Max time.Duration }

func (s Span) String() string { return fmt.Sprintf("%s-%s", s.Min, s.Max) }

func (s Span) draw(r *rand.Rand) time.Duration {
	if s.Max <= s.Min {
		return s.Min
	}
	return s.Min + time.Duration(r.Int64N(int64(s.Max-s.Min)))
}

// Config is one soak.
type Config struct {
	// Jobs is how many jobs run; Slots the operator's jobs in flight.
	Jobs, Slots int
	// KillEvery, PodDeleteEvery, BuildkiteFaultEvery, APICutEvery and APIOutageEvery space
	// the faults; a zero Span turns that kind off.
	KillEvery, PodDeleteEvery, BuildkiteFaultEvery, APICutEvery, APIOutageEvery Span
	// WarmPool is the size of the jobs' environment's warm pool (0: none; it needs
	// Webhooks, which serve the hand-off), and WarmPodDeleteEvery spaces the deletions of
	// its idle pods.
	WarmPool           int32
	WarmPodDeleteEvery Span
	// APIOutage is how long an outage of the API server lasts.
	APIOutage Span
	// APIDelayProbability and APIMaxDelay: how often, and by how much at most, the proxy
	// holds back a connection or a request.
	APIDelayProbability float64
	APIMaxDelay         time.Duration
	// Webhooks serves the admission webhooks from the host's operator (hostWebhooks), as
	// in the cluster; false leaves them off.
	Webhooks bool
	// Bound is the longest a job may take from its accept to its finish before it counts
	// as stuck.
	Bound time.Duration
	// Timeout bounds the run's faults: when it runs out they stop, and the jobs not ended
	// get Bound more to end; those that do not are lost (or stuck, if never accepted).
	Timeout time.Duration
	// Seed makes the schedule of faults repeatable (the timing of the system is not).
	Seed uint64
	// Dir keeps the operator's and the fake's logs and the local node's state.
	Dir string
	// Agentd is the agentd binary run as the operator.
	Agentd string
	// Logf receives progress messages.
	Logf func(string, ...any)
}

// Lease timings of the soak's operator: a killed leader's successor takes over within
// LeaseDuration, and the leader gives up after RenewDeadline of failed renewals (the
// proxy's outages make that happen too).
const (
	LeaseDuration = 6 * time.Second
	RenewDeadline = 4 * time.Second
	RetryPeriod   = time.Second
	// leaseName is the operator's leader election Lease (its -leader-election-id default).
	leaseName = "buildkite-operator"
)

// DefaultConfig is the full soak's configuration for n jobs.
func DefaultConfig(n int) Config {
	return Config{
		Jobs:                n,
		Slots:               8,
		KillEvery:           Span{5 * time.Second, 20 * time.Second},
		PodDeleteEvery:      Span{10 * time.Second, 30 * time.Second},
		BuildkiteFaultEvery: Span{time.Second, 3 * time.Second},
		APICutEvery:         Span{3 * time.Second, 10 * time.Second},
		APIOutageEvery:      Span{40 * time.Second, 90 * time.Second},
		APIOutage:           Span{2 * time.Second, 6 * time.Second},
		APIDelayProbability: 0.05,
		APIMaxDelay:         2 * time.Second,
		Webhooks:            true,
		WarmPool:            3,
		WarmPodDeleteEvery:  Span{15 * time.Second, 40 * time.Second},
		Bound:               5 * time.Minute,
		Timeout:             time.Duration(n)*6*time.Second + 10*time.Minute,
	}
}

// Kinds of fault, as the result counts them.
const (
	FaultKill           = "agentd SIGKILL"
	FaultSelfExit       = "agentd exited by itself"
	FaultPodDeleted     = "job pod deleted"
	FaultWarmPodDeleted = "idle warm pod deleted"
	FaultBuildkite5xx   = "buildkite 5xx"
	FaultBuildkite429   = "buildkite 429 + Retry-After"
	FaultBuildkiteDrop  = "buildkite dropped connection"
	FaultAPIDelay       = "api server delay"
	FaultAPICut         = "api server connection cut"
	FaultAPIOutage      = "api server outage"
)

// FaultKinds is the order the table shows them in.
var FaultKinds = []string{FaultKill, FaultSelfExit, FaultPodDeleted, FaultWarmPodDeleted, FaultBuildkite5xx, FaultBuildkite429,
	FaultBuildkiteDrop, FaultAPIDelay, FaultAPICut, FaultAPIOutage}

// Result is what a soak found.
type Result struct {
	Config ResultConfig `json:"config"`
	// Audit holds the measures, with the IDs of the jobs concerned.
	Audit harness.Audit `json:"audit"`
	// Faults counts the faults that happened, by kind (a Buildkite fault counts when a
	// request hit it).
	Faults      map[string]int64 `json:"faults"`
	WallSeconds float64          `json:"wall_seconds"`
	// Disturbed is how many jobs had their pod deleted.
	Disturbed int `json:"disturbed"`
	// WarmStarts is how many jobs ran in a warm pod.
	WarmStarts int       `json:"warm_starts"`
	Started    time.Time `json:"started"`
}

// ResultConfig is the part of the configuration a reader of the result needs.
type ResultConfig struct {
	Jobs           int    `json:"jobs"`
	Slots          int    `json:"slots"`
	KillEvery      string `json:"kill_every"`
	PodDeleteEvery string `json:"pod_delete_every"`
	WarmPool       int32  `json:"warm_pool"`
	Bound          string `json:"bound"`
	Seed           uint64 `json:"seed"`
}

// Passed: no job lost, doubled, stuck, or with an incomplete log.
func (r *Result) Passed() bool { return !r.Audit.Failed() }

// Job shapes. Most jobs print slowly, so that kills and cuts land while they run; every
// fifth prints a burst, which fills log chunks back to back.
const (
	slowLines  = 40
	slowPause  = 250 * time.Millisecond
	burstLines = 2000
)

func linesOf(i int) (int, time.Duration) {
	if i%5 == 4 {
		return burstLines, 0
	}
	return slowLines, slowPause
}

// buildSize is how many steps each of the soak's builds has.
const buildSize = 50

// Run runs a soak on the local node (root) and returns what it found. An error means the
// soak itself could not run; the jobs' fate is in the Result.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Jobs <= 0 || cfg.Slots <= 0 {
		return nil, fmt.Errorf("jobs (%d) and slots (%d) must be at least 1", cfg.Jobs, cfg.Slots)
	}
	if cfg.WarmPool > 0 && !cfg.Webhooks {
		return nil, fmt.Errorf("a warm pool (%d) needs the webhooks: the hand-off is served beside them", cfg.WarmPool)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the soak starts a local Kubernetes node: run it as root")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	// The fake logs every request: that goes to a file only.
	fakeLog, err := os.Create(filepath.Join(cfg.Dir, "fake-buildkite.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = fakeLog.Close() }()
	var logMu sync.Mutex
	progress := cfg.Logf
	logf := func(format string, args ...any) {
		if strings.HasPrefix(format, "fake buildkite") {
			logMu.Lock()
			defer logMu.Unlock()
			fmt.Fprintf(fakeLog, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
			return
		}
		progress(format, args...)
	}
	cfg.Logf = logf
	res = &Result{
		Config: ResultConfig{Jobs: cfg.Jobs, Slots: cfg.Slots, KillEvery: cfg.KillEvery.String(),
			PodDeleteEvery: cfg.PodDeleteEvery.String(), WarmPool: cfg.WarmPool, Bound: cfg.Bound.String(), Seed: cfg.Seed},
		Faults:  map[string]int64{},
		Started: time.Now(),
	}
	env, err := harness.Start(ctx, harness.Options{
		StateDir:    filepath.Join(cfg.Dir, "node"),
		Agentd:      cfg.Agentd,
		Spawn:       cfg.Slots,
		HostProcess: true,
		// Later flags win over the harness's host-process defaults.
		OperatorArgs: []string{
			"--leader-elect=true",
			"--leader-elect-lease-duration", LeaseDuration.String(),
			"--leader-elect-renew-deadline", RenewDeadline.String(),
			"--leader-elect-retry-period", RetryPeriod.String(),
		},
		Logf: cfg.Logf,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		cfg.Logf("stopping")
		err = errors.Join(err, env.Stop(context.WithoutCancel(ctx)))
	}()
	s := &soak{cfg: cfg, env: env, res: res, rng: rand.New(rand.NewPCG(cfg.Seed, 2)), disturbed: map[string]bool{}}
	if err := s.throughProxy(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = s.proxy.Close() }()
	return res, s.run(ctx)
}

// soak is a run in progress.
type soak struct {
	cfg   Config
	env   *harness.Env
	res   *Result
	proxy *Proxy

	mu        sync.Mutex
	rng       *rand.Rand
	disturbed map[string]bool // job IDs whose pod was deleted
	// opMu serialises restarts of the operator (the killer and the watchdog).
	opMu sync.Mutex
}

func (s *soak) draw(sp Span) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sp.draw(s.rng)
}

func (s *soak) count(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.res.Faults[kind]++
}

// throughProxy restarts the operator with a kubeconfig that reaches the API server through
// the chaos proxy, as the chart's ServiceAccount.
func (s *soak) throughProxy(ctx context.Context) error {
	u, err := url.Parse(s.env.REST.Host)
	if err != nil {
		return fmt.Errorf("the API server's address %q: %w", s.env.REST.Host, err)
	}
	s.proxy, err = StartProxy(u.Host, ProxyConfig{DelayProbability: s.cfg.APIDelayProbability, MaxDelay: s.cfg.APIMaxDelay, Seed: s.cfg.Seed})
	if err != nil {
		return err
	}
	user, err := helmchart.ApplyServiceAccount(ctx, s.env.Client, s.env.Namespace, s.env.JobNamespace)
	if err != nil {
		return err
	}
	kc, err := clientcmd.LoadFromFile(s.env.Kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", s.env.Kubeconfig, err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + s.proxy.Addr()
	}
	for _, a := range kc.AuthInfos {
		a.Impersonate = user
	}
	path := filepath.Join(s.cfg.Dir, "operator.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	op := s.env.Process
	if err := op.Stop(30 * time.Second); err != nil {
		return err
	}
	if s.cfg.Webhooks {
		configuration, err := hostWebhooks(ctx, s.env.Client, s.env.Namespace, s.env.JobNamespace, s.env.Node.HostAddress())
		if err != nil {
			return err
		}
		op.Args = append(op.Args, "--webhooks=true", "--webhook-configuration-name="+configuration)
	}
	op.Env = []string{"KUBECONFIG=" + path}
	if err := op.Start(); err != nil {
		return err
	}
	s.cfg.Logf("the operator runs as %s through the API server proxy at %s, webhooks %t", user, s.proxy.Addr(), s.cfg.Webhooks)
	if err := s.env.WaitAgents(ctx, s.cfg.Slots, 2*time.Minute); err != nil {
		return err
	}
	if s.cfg.WarmPool > 0 {
		return s.keepWarmPool(ctx, s.cfg.WarmPool)
	}
	return nil
}

func (s *soak) run(ctx context.Context) error {
	ids, expect, err := s.queueJobs()
	if err != nil {
		return err
	}
	t0 := time.Now()
	cctx, stopChaos := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, loop := range []struct {
		every Span
		do    func(context.Context)
	}{
		{s.cfg.KillEvery, s.kill},
		{Span{time.Second, time.Second}, s.watchdog},
		{s.cfg.PodDeleteEvery, s.deletePod},
		{s.cfg.WarmPodDeleteEvery, s.deleteWarmPod},
		{s.cfg.BuildkiteFaultEvery, s.buildkiteFault},
		{s.cfg.APICutEvery, s.apiCut},
		{s.cfg.APIOutageEvery, s.apiOutage},
	} {
		if loop.every.Max <= 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-cctx.Done():
					return
				case <-time.After(s.draw(loop.every)):
				}
				loop.do(cctx)
			}
		}()
	}
	werr := s.waitJobs(ctx, ids, t0, s.cfg.Timeout)
	stopChaos()
	wg.Wait()
	s.env.Fake.ClearFaults()
	if errors.Is(werr, context.DeadlineExceeded) {
		// Jobs still going when the time ran out may have been accepted a moment before
		// (the full soak at 0a8af59 counted three accepted in its last two minutes as
		// lost). With the faults stopped, each gets the bound any job has before it counts
		// as lost or stuck: one that does not end within it never would.
		s.cfg.Logf("faults stopped; the jobs not ended yet get the bound, %s, to end", s.cfg.Bound)
		werr = s.waitJobs(ctx, ids, t0, s.cfg.Bound)
	}
	s.res.WallSeconds = time.Since(t0).Seconds()
	// The record as it stands when the run ends, before anything else happens to a job.
	var jobs []fakebuildkite.JobSnapshot
	for _, id := range ids {
		j, _ := s.env.Fake.Job(id)
		jobs = append(jobs, j)
	}
	// Stopped while the proxy still carries its requests, so that it stops at once.
	if err := s.env.Process.Stop(30 * time.Second); err != nil {
		s.cfg.Logf("stopping the operator: %v", err)
	}
	s.mu.Lock()
	disturbed := s.disturbed
	s.mu.Unlock()
	s.res.Disturbed = len(disturbed)
	s.res.Audit = harness.AuditJobs(jobs, func(id string) harness.Expect {
		return harness.Expect{Lines: expect[id], Bound: s.cfg.Bound, Disturbed: disturbed[id]}
	})
	s.countFaults()
	if s.cfg.WarmPool > 0 {
		if err := s.countWarmStarts(ctx, ids); err != nil {
			s.cfg.Logf("counting the jobs that ran warm: %v", err)
		}
	}
	if werr != nil && !errors.Is(werr, context.DeadlineExceeded) {
		return werr
	}
	return nil
}

// queueJobs creates the builds: Jobs steps, in builds of buildSize. It returns the job IDs
// and the numbered lines each prints.
func (s *soak) queueJobs() ([]string, map[string]int, error) {
	var ids []string
	expect := map[string]int{}
	for first := 0; first < s.cfg.Jobs; first += buildSize {
		var b strings.Builder
		b.WriteString("steps:\n")
		var lines []int
		for i := first; i < min(first+buildSize, s.cfg.Jobs); i++ {
			n, pause := linesOf(i)
			lines = append(lines, n)
			b.WriteString(harness.NumberedStep(fmt.Sprintf("soak %d", i), n, pause))
		}
		build, err := s.env.Fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "soak", PipelineYAML: b.String()})
		if err != nil {
			return nil, nil, fmt.Errorf("creating a build: %w", err)
		}
		if len(build.Jobs) != len(lines) {
			return nil, nil, fmt.Errorf("a build of %d steps has %d jobs", len(lines), len(build.Jobs))
		}
		for k, id := range build.Jobs {
			expect[id] = lines[k]
		}
		ids = append(ids, build.Jobs...)
	}
	s.cfg.Logf("queued %d jobs", len(ids))
	return ids, expect, nil
}

// waitJobs waits until every job has ended on the fake, or for at most timeout.
func (s *soak) waitJobs(ctx context.Context, ids []string, t0 time.Time, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lastLog := time.Now()
	for {
		done := 0
		for _, id := range ids {
			if j, ok := s.env.Fake.Job(id); ok && fakebuildkite.IsTerminal(j.State) {
				done++
			}
		}
		if done == len(ids) {
			s.cfg.Logf("all %d jobs ended after %s", done, time.Since(t0).Round(time.Second))
			return nil
		}
		if time.Since(lastLog) > 30*time.Second {
			s.mu.Lock()
			s.cfg.Logf("%d of %d jobs ended after %s; faults so far: %v", done, len(ids), time.Since(t0).Round(time.Second), s.res.Faults)
			s.mu.Unlock()
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			s.cfg.Logf("%d of %d jobs ended when the wait of %s ran out", done, len(ids), timeout)
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// kill sends SIGKILL to the operator and starts it again at once. Three times in four it
// then waits until the new process holds the leader election Lease, so that the next kill
// (KillEvery later) lands on a leader that has had time to work: a SIGKILLed leader cannot
// release its Lease, and its successor waits LeaseDuration for it, which would otherwise
// take most of each interval. The fourth kill may land on a process still starting.
func (s *soak) kill(ctx context.Context) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	op := s.env.Process
	if !op.Running() {
		return // the watchdog restarts it
	}
	before := s.leaseHolder(ctx)
	if err := op.Kill(); err != nil {
		s.cfg.Logf("killing the operator: %v", err)
		return
	}
	s.count(FaultKill)
	if err := op.Start(); err != nil {
		s.cfg.Logf("starting the operator again: %v", err)
		return
	}
	s.mu.Lock()
	toLeader := s.rng.IntN(4) != 0
	s.mu.Unlock()
	if !toLeader {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 2*LeaseDuration+30*time.Second)
	defer cancel()
	_ = wait.PollUntilContextCancel(wctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		h := s.leaseHolder(ctx)
		return h != "" && h != before, nil
	})
}

// leaseHolder is the leader election Lease's holder, "" when unknown.
func (s *soak) leaseHolder(ctx context.Context) string {
	var l coordinationv1.Lease
	if err := s.env.Client.Get(ctx, client.ObjectKey{Namespace: s.env.Namespace, Name: leaseName}, &l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// watchdog starts the operator again when it exited by itself (it lost its Lease).
func (s *soak) watchdog(context.Context) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	op := s.env.Process
	if op.Running() {
		return
	}
	s.count(FaultSelfExit)
	_ = op.Kill() // forgets the exited process
	if err := op.Start(); err != nil {
		s.cfg.Logf("starting the operator again: %v", err)
	}
}

// deletePod deletes a running job pod, chosen at random, as `kubectl delete pod` does.
func (s *soak) deletePod(ctx context.Context) {
	var pods corev1.PodList
	if err := s.env.Client.List(ctx, &pods, client.InNamespace(s.env.JobNamespace), client.HasLabels{bkv1.LabelJob}); err != nil {
		s.cfg.Logf("listing job pods: %v", err)
		return
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		return
	}
	sort.Slice(running, func(a, b int) bool { return running[a].Name < running[b].Name })
	s.mu.Lock()
	p := running[s.rng.IntN(len(running))]
	// Marked before the delete: a job that ends at once is still disturbed.
	s.disturbed[p.Labels[bkv1.LabelJob]] = true
	s.mu.Unlock()
	if err := s.env.Client.Delete(ctx, &p, client.Preconditions{UID: &p.UID}); err != nil {
		s.cfg.Logf("deleting pod %s: %v", p.Name, err)
		return
	}
	s.count(FaultPodDeleted)
}

// faultEndpoints are the agent API endpoints the soak's jobs use: the spawner's (ping, the
// streaming ping, cut mid-job, heartbeat, accept), the supervisor's (start, chunks, job
// state) and the controller's (finish, job state).
var faultEndpoints = []string{
	fakebuildkite.EPPing, fakebuildkite.EPStreamPings, fakebuildkite.EPHeartbeat, fakebuildkite.EPAccept, fakebuildkite.EPStart,
	fakebuildkite.EPChunks, fakebuildkite.EPJobState, fakebuildkite.EPFinish,
}

// buildkiteFault makes the next one to three requests to a random endpoint fail. The
// fault it made before goes first: a fault waits for its requests, and faults on the
// endpoints a job calls once (start, accept, finish) would otherwise pile up until every
// such call failed, many times over.
func (s *soak) buildkiteFault(context.Context) {
	s.env.Fake.ClearFaults()
	s.mu.Lock()
	f := fakebuildkite.Fault{Endpoint: faultEndpoints[s.rng.IntN(len(faultEndpoints))], Times: 1 + s.rng.IntN(3)}
	switch s.rng.IntN(3) {
	case 0:
		f.Status = []int{500, 502, 503, 504}[s.rng.IntN(4)]
	case 1:
		f.Status, f.RetryAfter = 429, time.Duration(1+s.rng.IntN(3))*time.Second
	default:
		f.DropConnection = true
	}
	s.mu.Unlock()
	s.env.Fake.Inject(f)
}

func (s *soak) apiCut(context.Context) {
	s.mu.Lock()
	all := s.rng.IntN(10) == 0
	s.mu.Unlock()
	if all {
		s.proxy.CutAll()
	} else {
		s.proxy.CutOne()
	}
}

func (s *soak) apiOutage(context.Context) {
	d := s.draw(s.cfg.APIOutage)
	s.cfg.Logf("API server outage for %s", d)
	s.proxy.Outage(d)
}

// countFaults adds the faults the fake and the proxy counted to the result.
func (s *soak) countFaults() {
	for _, r := range s.env.Fake.Requests() {
		switch {
		case !r.Faulted:
		case r.Status == 0:
			s.res.Faults[FaultBuildkiteDrop]++
		case r.Status == 429:
			s.res.Faults[FaultBuildkite429]++
		case r.Status >= 500:
			s.res.Faults[FaultBuildkite5xx]++
		}
	}
	delays, cuts, outages := s.proxy.Counts()
	s.res.Faults[FaultAPIDelay] += delays
	s.res.Faults[FaultAPICut] += cuts
	s.res.Faults[FaultAPIOutage] += outages
}

// Table is the result as the README shows it.
func (r *Result) Table() string {
	var b strings.Builder
	a := r.Audit
	row := func(k string, v any) { fmt.Fprintf(&b, "| %s | %v |\n", k, v) }
	b.WriteString("| measure | value |\n|---|---|\n")
	row("jobs", a.Jobs)
	row("lost (accepted, never finished)", len(a.Lost))
	row("doubled (more than one finish accepted)", len(a.Doubled))
	row("stuck (finished more than "+r.Config.Bound+" after accept, or never accepted)", len(a.Stuck))
	row("incomplete logs (a numbered line missing, repeated or out of order)", len(a.IncompleteLogs))
	row("second finishes refused", a.RefusedFinishes)
	row("accepted more than once", len(a.Reaccepted))
	row("failed though undisturbed", len(a.FailedUndisturbed))
	row("jobs whose pod was deleted", r.Disturbed)
	row("jobs that ran in a warm pod (pool of "+strconv.Itoa(int(r.Config.WarmPool))+")", r.WarmStarts)
	for _, k := range FaultKinds {
		row(k, r.Faults[k])
	}
	row("wall time", (time.Duration(r.WallSeconds * float64(time.Second))).Round(time.Second))
	row("slots; kill every; pod deleted every", strconv.Itoa(r.Config.Slots)+"; "+r.Config.KillEvery+"; "+r.Config.PodDeleteEvery)
	return b.String()
}
