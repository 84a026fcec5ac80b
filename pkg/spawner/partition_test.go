package spawner_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// TestAPIServerUnreachable cuts the spawner off from the API server. The job Buildkite gives
// it then must not wait for the cluster to come back, but fail once CreateTimeout has passed,
// saying why; later jobs stay in Buildkite's queue; once the cluster answers, the same slot
// runs them.
func TestAPIServerUnreachable(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0) // the controller's part runs on the other side of the cut

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
