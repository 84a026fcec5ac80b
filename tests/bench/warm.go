package bench

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// The warm-pool phase (issue 28) follows the closed loop's jobs in the same run, so that its
// pickup is printed beside the cold pickup and the floor of that run: the default
// environment keeps a pool of warm pods (WarmPoolSize: as many as jobs in flight on kwok, at
// least 2 on the node), and each round, once every pod of the pool waits at agentd's hand-off
// endpoint, queues as many jobs as are in flight at once.
//
// The hand-off endpoint is served on agentd's webhook server, so agentd runs with its
// webhooks on (the cold jobs too, for one agentd in both phases). No webhook configuration
// names them, so the API server calls none: the cold jobs run as without webhooks. agentd
// mints the server's certificate itself, for the webhook Service's names, the bare name
// among them.
//
// On kwok the warm pods' supervisor is the stand-in, on this host, where no cluster DNS or
// Service routing exists: naming the Service "localhost" makes the certificate valid for the
// name the host reaches agentd by (--handoff-url), with TLS checked as in a cluster. For the
// same reason the stand-in's requests come from this host, not from the warm pods'
// addresses, which are kwok's inventions: agentd's check that a token is used from its pod's
// address is turned off (--handoff-check-address=false), and the bench does not time it (a
// read of agentd's cache of pods). On the node the warm pods' own supervisors fetch their
// jobs, through a Service to this host, with the check on (warmnode.go).
const (
	warmWebhookService = "localhost"
	// warmCAConfigMap gets agentd's CA bundle, which the warm pods' hand-off volume projects,
	// and warmWebhookSecret its certificates.
	warmCAConfigMap   = "bench-handoff-ca"
	warmWebhookSecret = "bench-webhook-tls"
	// warmWebhookConfiguration is the configuration agentd's certificate manager writes its CA
	// bundle into: the bench makes it with no webhook in it.
	warmWebhookConfiguration = "bench-buildkite-operator"
	// warmWait bounds each wait of the phase other than the jobs' own (Config.Timeout).
	warmWait = 2 * time.Minute
	// warmEnvironment is the environment the bench's jobs run in (harness.SampleEnvironments).
	warmEnvironment = "default"
)

// WarmResult is a run's warm-pool phase.
type WarmResult struct {
	// PoolSize is the pool's spec.warmPool.size (WarmPoolSize): on kwok the jobs in flight,
	// so the pool is as large as each round's load; on the node at least 2.
	PoolSize int `json:"pool_size"`
	Rounds   int `json:"rounds"`
	// Jobs is how many jobs the phase queued; Passed how many finished with exit status 0.
	Jobs   int `json:"jobs"`
	Passed int `json:"passed"`
	// Warm is how many of them started in a warm pod; the others started in a pod of their own.
	Warm int `json:"warm"`
	// Phases are the latencies of a warm job's steps, then its pickup.
	Phases []Phase `json:"phases"`
	// Requests are the API server's requests per job, from the first round's queueing to
	// the last job's pod gone: a warm job's, its pool's replacement pod included.
	Requests Requests `json:"requests_per_job"`
}

// The moments of a warm job.
const (
	wAccepted  = iota // accept (the fake's job record)
	wBuildJob         // the BuildJob created (audit log)
	wAssigned         // agentd's patch making a warm pod the job's (audit log)
	wHandedOff        // the pod's fetch of the job answered: the stand-in's record, agentd's log on the node
	wStarted          // start reaches the fake (its job record)
	nWarmMoments
)

// The phases issue 28's warm targets are about, on kwok and on the node.
const (
	warmPickupPhase     = "accepted → supervisor start: warm pickup (target p50 ≤ 100 ms)"
	nodeWarmPickupPhase = "accepted → supervisor start: warm pickup (target p50 ≤ 300 ms)"
)

type warmPhaseDef struct {
	name     string
	from, to int
}

var warmPhaseDefs = []warmPhaseDef{
	{"accepted → BuildJob created", wAccepted, wBuildJob},
	{"BuildJob created → warm pod assigned (agentd's patch)", wBuildJob, wAssigned},
	{"warm pod assigned → job handed off (the stand-in's fetch answered)", wAssigned, wHandedOff},
	{"job handed off → supervisor start (the stand-in)", wHandedOff, wStarted},
	{warmPickupPhase, wAccepted, wStarted},
}

// nodeWarmPhaseDefs are the node's: the hand-off's moment is agentd's log line once it
// wrote the answer, and the supervisor the pod's own.
var nodeWarmPhaseDefs = []warmPhaseDef{
	{"accepted → BuildJob created", wAccepted, wBuildJob},
	{"BuildJob created → warm pod assigned (agentd's patch)", wBuildJob, wAssigned},
	{"warm pod assigned → job handed off (agentd's log: its answer to the pod's fetch)", wAssigned, wHandedOff},
	{"job handed off → supervisor start (the pod's supervisor)", wHandedOff, wStarted},
	{nodeWarmPickupPhase, wAccepted, wStarted},
}

// warmPhaseDefsFor are backend's warm phases.
func warmPhaseDefsFor(backend string) []warmPhaseDef {
	if backend == BackendNode {
		return nodeWarmPhaseDefs
	}
	return warmPhaseDefs
}

// isWarmPickup tells whether the phase named name is a warm pickup, either backend's.
func isWarmPickup(name string) bool { return name == warmPickupPhase || name == nodeWarmPickupPhase }

// pickup is the warm pickup's percentiles, and whether the phase measured any.
func (w *WarmResult) pickup() (Stats, bool) {
	if w == nil {
		return Stats{}, false
	}
	for _, p := range w.Phases {
		if isWarmPickup(p.Name) {
			return p.Stats, p.Samples > 0
		}
	}
	return Stats{}, false
}

// checkWarm refuses a warm phase the run cannot have.
func (c *Config) checkWarm() error {
	pool := WarmPoolSize(c.Backend, c.InFlight)
	switch {
	case !c.Warm:
		return nil
	case pool > bkv1.WarmPoolMaxSize:
		return fmt.Errorf("the warm-pool phase keeps a pool of %d warm pods for %d jobs in flight on %s, and a pool holds at most %d: run at most %d in flight, or without the warm phase",
			pool, c.InFlight, c.Backend, bkv1.WarmPoolMaxSize, bkv1.WarmPoolMaxSize)
	case c.Rate > 0:
		return fmt.Errorf("the warm-pool phase follows the closed loop, not an open loop (-rate)")
	}
	return nil
}

// webhookArgs are agentd's flags for its webhook server: none, as the end-to-end suite runs
// it on the host, unless the warm phase needs the hand-off endpoint.
func (r *run) webhookArgs() []string {
	if !r.cfg.Warm {
		return []string{"--webhooks=false"}
	}
	port := strconv.Itoa(r.webhookPort)
	args := []string{
		"--webhooks=true",
		"--webhook-port", port,
		"--webhook-configuration-name", warmWebhookConfiguration,
		"--webhook-secret", warmWebhookSecret,
		"--handoff-ca-configmap", warmCAConfigMap,
	}
	if r.ce.simulated {
		return append(args,
			"--webhook-service", warmWebhookService,
			"--handoff-url", "https://"+net.JoinHostPort(warmWebhookService, port)+handoff.Path,
			"--handoff-check-address=false",
		)
	}
	// The node: agentd's default hand-off URL, https://<service>.<namespace>.svc/handoff,
	// which the pods reach through the Service serveHandoffToPods makes, with their own
	// addresses; and its log's timestamps to the nanosecond, which time the hand-offs.
	return append(args,
		"--webhook-service", nodeWebhookService,
		"--handoff-check-address=true",
		"--zap-time-encoding=rfc3339nano",
	)
}

// freePort is a TCP port free on this host a moment ago.
func freePort() (int, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, err
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(port)
}

// setupWarm makes what the warm phase needs before agentd starts: the namespace's default
// ServiceAccount, whose tokens the warm pods prove who they are with (no controller manager
// runs here to make it), and the webhook configuration for agentd's CA bundle, with no
// webhook in it.
func (r *run) setupWarm(ctx context.Context) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: namespace}}
	if err := r.c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the default ServiceAccount: %w", err)
	}
	vwc := &admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: warmWebhookConfiguration}}
	if err := r.c.Create(ctx, vwc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ValidatingWebhookConfiguration %s: %w", warmWebhookConfiguration, err)
	}
	return nil
}

// waitCertificates waits until agentd's certificate manager has written the CA bundle for
// warm pods and the Secret of its certificates, its writes after a start, which are then not
// counted as the cold jobs'.
func (r *run) waitCertificates(ctx context.Context) error {
	for {
		cm, sec := &corev1.ConfigMap{}, &corev1.Secret{}
		err := r.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: warmCAConfigMap}, cm)
		if err == nil {
			err = r.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: warmWebhookSecret}, sec)
		}
		switch {
		case err == nil && cm.Data["ca.crt"] != "" && len(sec.Data[corev1.TLSCertKey]) > 0:
			return nil
		case err != nil && !apierrors.IsNotFound(err):
			return fmt.Errorf("reading agentd's certificates: %w", err)
		case !r.op.running():
			return fmt.Errorf("the operator exited before it wrote its certificates; its log ends:\n%s", r.op.tail())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the operator to write its certificates (Secret %s, ConfigMap %s): %w; its log ends:\n%s",
				warmWebhookSecret, warmCAConfigMap, ctx.Err(), r.op.tail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// warmPhase runs the warm-pool phase and fills in the result's Warm; then it stops agentd.
func (r *run) warmPhase(ctx context.Context) error {
	n, pool := r.cfg.InFlight, WarmPoolSize(r.cfg.Backend, r.cfg.InFlight)
	w := &WarmResult{PoolSize: pool, Rounds: r.cfg.Rounds}
	r.res.Warm = w
	// The operator keeps no more idle warm pods than its free slots (n, all free between
	// rounds): a pool larger than that waits with n pods.
	kept := min(pool, n)
	r.cfg.Logf("warm pool: %d warm pods (%d kept idle: the operator's %d slots), %d round(s) of %d jobs at once", pool, kept, n, r.cfg.Rounds, n)
	if err := r.setWarmPool(ctx, pool); err != nil {
		return err
	}
	var ids []string
	var from time.Time
	for round := range r.cfg.Rounds {
		if err := r.waitPool(ctx, kept); err != nil {
			return fmt.Errorf("warm pool, round %d: %w", round+1, err)
		}
		if round == 0 {
			from = time.Now()
		}
		q := &queued{}
		if err := r.createBuild(r.res.Jobs+round*n, n, "echo bench", q); err != nil {
			return err
		}
		if err := r.waitJobs(ctx, q.all()); err != nil {
			return fmt.Errorf("warm pool, round %d: %w", round+1, err)
		}
		ids = append(ids, q.all()...)
	}
	// The requests a job causes end when its pod is gone.
	gctx, cancel := context.WithTimeout(ctx, warmWait)
	defer cancel()
	err := r.w.waitFor(gctx, "the warm jobs' pods to be deleted", func() bool {
		for _, assigned := range r.w.warmPods {
			if assigned {
				return false
			}
		}
		return true
	})
	if err != nil {
		r.cfg.Logf("%v: counting requests up to now", err)
	}
	to := time.Now()
	if err := r.tallyWarm(w, ids, from, to); err != nil {
		return err
	}

	r.cfg.Logf("warm pool: %d of %d jobs started warm; emptying the pool", w.Warm, w.Jobs)
	if err := r.setWarmPool(ctx, 0); err != nil {
		return err
	}
	dctx, cancelDelete := context.WithTimeout(ctx, warmWait)
	defer cancelDelete()
	if err := r.w.waitFor(dctx, "the warm pods to be deleted", func() bool { return len(r.w.warmPods) == 0 }); err != nil {
		return err
	}
	if r.sup != nil {
		if err := r.sup.wait(); err != nil {
			return fmt.Errorf("the stand-in supervisor: %w", err)
		}
	}
	err = r.op.stop(30 * time.Second)
	r.op = nil
	return err
}

// tallyWarm fills in w from the jobs ids, the requests in [from, to], the audit log's
// moments and the hand-offs: the stand-in's on kwok, agentd's log's on the node.
func (r *run) tallyWarm(w *WarmResult, ids []string, from, to time.Time) error {
	jobs := make([]fakebuildkite.JobSnapshot, 0, len(ids))
	for _, id := range ids {
		j, _ := r.fake.Job(id)
		jobs = append(jobs, j)
		if j.ExitStatus == "0" {
			w.Passed++
		}
	}
	w.Jobs = len(jobs)
	st, err := readServerTimes(r.ce.auditLog)
	if err != nil {
		return err
	}
	handoffs, err := r.handoffs()
	if err != nil {
		return err
	}
	moments, warm := warmMoments(jobs, r.w.jobsSeen(), st, handoffs)
	w.Warm = warm
	w.Phases = warmPhases(moments, warmPhaseDefsFor(r.cfg.Backend))
	w.Requests, err = requestsPerJob(r.ce.auditLog, from, to, len(ids))
	return err
}

// handoffs are the jobs handed off to warm pods, by Buildkite job ID: as the stand-in saw
// them on kwok, as agentd logged them on the node.
func (r *run) handoffs() (map[string]handoffSeen, error) {
	if r.sup != nil {
		return r.sup.handedOff(), nil
	}
	return readHandoffLog(r.op.log)
}

// warmMoments are the moments of each job of the warm phase, and how many started in a
// warm pod: those whose hand-off was seen.
func warmMoments(jobs []fakebuildkite.JobSnapshot, seen map[string]observed, st serverTimes, handoffs map[string]handoffSeen) ([][nWarmMoments]time.Time, int) {
	out := make([][nWarmMoments]time.Time, 0, len(jobs))
	warm := 0
	for _, j := range jobs {
		var m [nWarmMoments]time.Time
		m[wAccepted], m[wStarted] = j.AcceptedAt, j.StartedAt
		if o, ok := seen[j.ID]; ok {
			m[wBuildJob] = o.buildJob
			if t, ok := st.buildJobCreated[o.buildJobName]; ok {
				m[wBuildJob] = t
			}
		}
		if h, ok := handoffs[j.ID]; ok {
			warm++
			m[wAssigned], m[wHandedOff] = st.podPatched[h.pod], h.at
		}
		out = append(out, m)
	}
	return out, warm
}

// warmPhases are the percentiles of each of defs over the jobs that have both its moments.
func warmPhases(moments [][nWarmMoments]time.Time, defs []warmPhaseDef) []Phase {
	out := make([]Phase, 0, len(defs))
	for _, d := range defs {
		var ds []time.Duration
		for _, m := range moments {
			if !m[d.from].IsZero() && !m[d.to].IsZero() {
				ds = append(ds, m[d.to].Sub(m[d.from]))
			}
		}
		out = append(out, Phase{Name: d.name, Stats: percentiles(ds)})
	}
	return out
}

// setWarmPool sets the bench environment's spec.warmPool.size; 0 removes the pool.
func (r *run) setWarmPool(ctx context.Context, size int) error {
	env := &bkv1.BuildEnvironment{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: warmEnvironment}, env); err != nil {
		return fmt.Errorf("reading BuildEnvironment %s: %w", warmEnvironment, err)
	}
	orig := env.DeepCopy()
	env.Spec.WarmPool = nil
	if size > 0 {
		env.Spec.WarmPool = &bkv1.WarmPool{Size: int32(size)}
	}
	if err := r.c.Patch(ctx, env, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("setting BuildEnvironment %s's warm pool to %d pods: %w", warmEnvironment, size, err)
	}
	return nil
}

// waitPool waits until n warm pods ask agentd for a job.
func (r *run) waitPool(ctx context.Context, n int) error {
	deadline := time.Now().Add(warmWait)
	poll := 50 * time.Millisecond
	if r.sup == nil {
		// The node's pods are read through their logs: less often.
		poll = 200 * time.Millisecond
	}
	for {
		if !r.op.running() {
			return fmt.Errorf("the operator exited while its warm pool filled; its log ends:\n%s", r.op.tail())
		}
		asking, why, err := r.asking(ctx)
		if err != nil {
			return err
		}
		if asking >= n {
			return nil
		}
		if time.Now().After(deadline) {
			env := &bkv1.BuildEnvironment{}
			status := "unreadable"
			if err := r.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: warmEnvironment}, env); err == nil && env.Status.WarmPool != nil {
				status = fmt.Sprintf("%+v", *env.Status.WarmPool)
			}
			return fmt.Errorf("after %s, %d of the pool's %d warm pods ask agentd for a job (the environment's status.warmPool: %s; the others: %s); agentd's log ends:\n%s",
				warmWait, asking, n, status, strings.Join(why, "; "), r.op.tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// asking is how many warm pods ask agentd for a job now, and why the others do not: the
// stand-in's on kwok; on the node, the pods' supervisors say so in their logs.
func (r *run) asking(ctx context.Context) (int, []string, error) {
	if r.sup != nil {
		n, why := r.sup.asking(time.Now())
		return n, why, nil
	}
	return r.nodeAsking(ctx)
}
