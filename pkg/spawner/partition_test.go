package spawner_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// partition is a TCP proxy in front of the API server that can be cut and mended, as a
// network partition between the operator and its cluster would.
type partition struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

func newPartition(t *testing.T, target string) *partition {
	p := &partition{t: t, target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *partition) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns[in], p.conns[out] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
}

// cut drops every connection and refuses new ones.
func (p *partition) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// mend accepts connections again, on the same address.
func (p *partition) mend() {
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err)
	p.serve(ln)
}

// config is env's REST config, through the proxy. The API server's certificate names
// 127.0.0.1, which the proxy listens on too.
func (p *partition) config(base *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(base)
	u, err := url.Parse(cfg.Host)
	require.NoError(p.t, err)
	u.Host = p.addr
	cfg.Host = u.String()
	return cfg
}

// partitioned is a partition in front of env's API server, with a client and a started
// cache of ns that reach it only through the partition.
func partitioned(t *testing.T, ns string) (*partition, client.Client, cache.Cache) {
	t.Helper()
	u, err := url.Parse(env.Config.Host)
	require.NoError(t, err)
	p := newPartition(t, u.Host)
	cfg := p.config(env.Config)
	cl, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	c, err := cache.New(cfg, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = c.Start(ctx) }()
	return p, cl, c
}

// TestAPIServerUnreachable cuts the spawner off from the API server. The job Buildkite gives
// it then must not wait for the cluster to come back, but fail once CreateTimeout has passed,
// saying why; later jobs stay in Buildkite's queue; once the cluster answers, the same slot
// runs them.
func TestAPIServerUnreachable(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0) // the controller's part runs on the other side of the cut

	p, cl, c := partitioned(t, ns)
	const createTimeout = 3 * time.Second
	startSpawnerWith(t, fake, ns, cl, func(sc *spawner.Config) {
		sc.Slots = 1
		sc.Cache = c
		sc.APIReader = cl
		sc.CreateTimeout = createTimeout
	})
	waitFor(t, fake, 30*time.Second, "the slot's agent to connect", func() bool {
		return connectedAgents(fake, "bk-operator-test-") == 1
	})

	p.cut()
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	start := time.Now()
	waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
	took := time.Since(start)
	assertFailedAtIntake(t, fake, ns, b.Jobs[0],
		"the Kubernetes API server could not be reached for 3s", "retry it once the operator's cluster is healthy")
	assert.GreaterOrEqual(t, took, createTimeout, "the job is failed only once CreateTimeout has passed")
	t.Logf("failed %s after the job was created", took.Round(10*time.Millisecond))

	// Still cut off, the slot takes no more jobs: they wait in Buildkite's queue, where
	// another operator could run them.
	b, err = fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	time.Sleep(2 * createTimeout)
	j, _ := fake.Job(b.Jobs[0])
	assert.Equal(t, fakebuildkite.StateScheduled, j.State, "a job created while the API server is unreachable stays in the queue")

	p.mend()
	waitJobsFinished(t, fake, b.Jobs, 60*time.Second)
	j, _ = fake.Job(b.Jobs[0])
	assert.Equal(t, "0", j.ExitStatus, "a job after the cluster came back runs; log:\n%s", fakebuildkite.PlainLog(j.Log))
	_, has := buildJobs(t, ns)[b.Jobs[0]]
	assert.True(t, has, "the job after the cut has its BuildJob")
}

// agentRequests is a reverse proxy in front of the fake Buildkite that records which
// replica (by User-Agent) called which agent API path, and when.
type agentRequests struct {
	srv *httptest.Server

	mu   sync.Mutex
	seen []agentRequest
}

type agentRequest struct {
	userAgent, path string
	at              time.Time
}

func newAgentRequests(t *testing.T, fake *fakebuildkite.Server) *agentRequests {
	target, err := url.Parse(fake.URL())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	a := &agentRequests{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.seen = append(a.seen, agentRequest{r.UserAgent(), r.URL.Path, time.Now()})
		a.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *agentRequests) endpoint() string { return a.srv.URL + "/v3" }

// times are the times of the requests of userAgent whose path ends with suffix, after from.
func (a *agentRequests) times(userAgent, suffix string, from time.Time) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []time.Time
	for _, r := range a.seen {
		if strings.HasPrefix(r.userAgent, userAgent) && strings.HasSuffix(r.path, suffix) && r.at.After(from) {
			out = append(out, r.at)
		}
	}
	return out
}

// replica is one operator replica: a manager with leader election, running a spawner.
type replica struct {
	sp       *spawner.Spawner
	stopped  chan error    // what the manager's Start returned
	lingered chan struct{} // closed once the spawner has lingered, as agentd does
}

// startReplica runs a manager with leader election over cfg (in ns, with short lease
// timings) and a spawner that calls Buildkite at endpoint as userAgent, as `agentd
// operator` does: when the manager stops by itself, the spawner lingers.
func startReplica(t *testing.T, cfg *rest.Config, ns, endpoint, userAgent string, lease, renew, retry time.Duration) *replica {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        env.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              "spawner-test",
		LeaderElectionNamespace:       ns,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &renew,
		RetryPeriod:                   &retry,
		Cache:                         cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
	})
	require.NoError(t, err)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(regToken), 0o600))
	sp, err := spawner.New(spawner.Config{
		Name:                  "bk-operator-test",
		Namespace:             ns,
		Endpoint:              endpoint,
		Slots:                 2,
		RegistrationTokenFile: tokenFile,
		Cache:                 mgr.GetCache(),
		APIReader:             mgr.GetAPIReader(),
		UserAgent:             userAgent,
		APIWaitScale:          0.01,
		Log:                   testr.NewWithOptions(t, testr.Options{Verbosity: 0}).WithValues("replica", userAgent),
	}, mgr.GetClient())
	require.NoError(t, err)
	require.NoError(t, mgr.Add(sp))
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{sp: sp, stopped: make(chan error, 1), lingered: make(chan struct{})}
	go func() {
		defer close(r.lingered)
		err := mgr.Start(ctx)
		r.stopped <- err
		if err != nil && ctx.Err() == nil {
			sp.Linger(ctx)
		}
		sp.StopHeartbeats()
	}()
	t.Cleanup(func() { cancel(); <-r.lingered })
	return r
}

// TestLeaseLostKeepsHeartbeats cuts the leader off from the API server for longer than its
// renew deadline while it runs a job, with a second replica that can still reach it. The
// leader loses its lease and stops; the agent of its busy slot must keep heartbeating all
// the same (Buildkite would otherwise see it go silent for the whole outage), without a
// ping, streaming ping or accept, as the other replica takes over. Once the API server answers again,
// the old leader lets go, and the job ends once.
func TestLeaseLostKeepsHeartbeats(t *testing.T) {
	const (
		lease = 4 * time.Second
		renew = 3 * time.Second
		retry = 500 * time.Millisecond
		// Heartbeats come every second (the fake's interval); a gap longer than this means
		// they stopped.
		maxGap = 3 * time.Second
	)
	ns := newNamespace(t)
	fake := startFake(t)
	calls := newAgentRequests(t, fake)
	u, err := url.Parse(env.Config.Host)
	require.NoError(t, err)
	p := newPartition(t, u.Host)

	a := startReplica(t, p.config(env.Config), ns, calls.endpoint(), "replica-a", lease, renew, retry)
	waitFor(t, fake, 30*time.Second, "replica a's agents", func() bool {
		return connectedAgents(fake, "bk-operator-test-") == 2
	})
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	jobID := b.Jobs[0]
	waitBuildJob(t, fake, ns, jobID)
	startReplica(t, env.Config, ns, calls.endpoint(), "replica-b", lease, renew, retry)

	cut := time.Now()
	p.cut()
	var lost time.Time
	select {
	case err := <-a.stopped:
		lost = time.Now()
		require.Error(t, err, "replica a's manager stopped by itself")
		t.Logf("replica a lost its lease %s after the cut: %v", lost.Sub(cut).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatal("replica a kept its lease without reaching the API server")
	}
	waitFor(t, fake, 30*time.Second, "replica b to take over", func() bool {
		return len(calls.times("replica-b", "/ping", cut)) > 0 || len(calls.times("replica-b", "/StreamPings", cut)) > 0
	})
	// Some heartbeats more, well after the lease was lost.
	time.Sleep(3 * maxGap)
	mended := time.Now()
	p.mend()

	beats := calls.times("replica-a", "/heartbeat", lost)
	require.NotEmpty(t, beats, "replica a's busy agent stopped heartbeating when the lease was lost")
	prev := lost
	for _, at := range append(beats, mended) {
		assert.LessOrEqual(t, at.Sub(prev), maxGap, "no heartbeat from replica a between %s and %s after the lease was lost",
			prev.Sub(lost).Round(time.Millisecond), at.Sub(lost).Round(time.Millisecond))
		prev = at
	}
	// Lingering takes nothing: a ping in flight when the lease was lost may still land.
	for _, path := range []string{"/ping", "/StreamPings", "/accept", "/register"} {
		assert.Empty(t, calls.times("replica-a", path, lost.Add(time.Second)), "replica a called %s after it lost its lease", path)
	}

	select {
	case <-a.lingered:
	case <-time.After(30 * time.Second):
		t.Fatal("replica a still lingers although the API server answers again")
	}
	done := time.Now()
	time.Sleep(maxGap)
	assert.Empty(t, calls.times("replica-a", "/heartbeat", done.Add(500*time.Millisecond)), "replica a heartbeats after it let go")

	reportAndCheckOnce(t, fake, ns, b, jobID)
}

// TestLingerWithoutStart: a manager that stops before it ever started the spawner (it
// never became leader, or failed to start) must not leave the process waiting to linger.
func TestLingerWithoutStart(t *testing.T) {
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	sp, err := spawner.New(spawner.Config{
		Name: "bk-operator-test", Namespace: "default", Endpoint: "http://127.0.0.1:1/v3", Slots: 1,
		RegistrationTokenFile: "unused", Cache: c, APIReader: env.Client,
	}, env.Client)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); sp.Linger(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Linger waits for a Start that never ran")
	}
}

// TestOfferedJobOutlivesTheStop stops the spawner (its leader lease lost, say) while the
// API server cannot take the slot's marker for the job Buildkite has just offered it, so
// the job is neither accepted nor refused. The slot must not disconnect its agent then:
// Buildkite keeps an offered job for the agent it offered it to, and only that agent's
// next ping gives it back. The next spawner resumes the registration and runs the job
// (the chaos soak found 3 of 300 jobs left offered to disconnected agents for good).
func TestOfferedJobOutlivesTheStop(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)

	p, cl, c := partitioned(t, ns)
	first := startSpawnerWith(t, fake, ns, cl, func(sc *spawner.Config) {
		sc.Slots = 1
		sc.Cache = c
		sc.APIReader = cl
		sc.CreateTimeout = time.Minute // the slot keeps trying to save its marker
	})
	waitFor(t, fake, 30*time.Second, "the slot's agent to connect", func() bool {
		return connectedAgents(fake, "bk-operator-test-") == 1
	})

	p.cut()
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	waitFor(t, fake, 30*time.Second, "the job to be offered to the slot", func() bool {
		j, _ := fake.Job(b.Jobs[0])
		return j.State == fakebuildkite.StateAssigned
	})
	time.Sleep(time.Second) // the slot is saving its marker, and failing
	first.stop()
	j, _ := fake.Job(b.Jobs[0])
	require.Equal(t, fakebuildkite.StateAssigned, j.State, "the job was neither accepted nor given back")
	assert.Equal(t, 1, connectedAgents(fake, "bk-operator-test-"),
		"the agent holding an offered job was disconnected: Buildkite would keep the job for it for good")

	p.mend()
	startSpawner(t, fake, ns, func(sc *spawner.Config) { sc.Slots = 1 })
	waitJobsFinished(t, fake, b.Jobs, 60*time.Second)
	j, _ = fake.Job(b.Jobs[0])
	assert.Equal(t, "0", j.ExitStatus, "log:\n%s", fakebuildkite.PlainLog(j.Log))
}
