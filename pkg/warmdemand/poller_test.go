package warmdemand_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/warmdemand"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

const token = "bkua_warmdemand-test-token-0123456789"

// interval is the tests' poll interval: short, so that they are quick.
const interval = 150 * time.Millisecond

// fakeOrg is a fake Buildkite with organization acme and the test token, with scopes.
func fakeOrg(t *testing.T, scopes ...string) *fakebuildkite.Server {
	t.Helper()
	fake := fakebuildkite.StartForTest(t, fakebuildkite.Options{})
	fake.REST().AddOrganization("acme")
	fake.REST().AddToken(fakebuildkite.APIToken{Token: token, Scopes: scopes, Organizations: []string{"acme"}})
	return fake
}

// build makes a build of pipeline in acme from yaml.
func build(t *testing.T, fake *fakebuildkite.Server, pipeline, yaml string) *fakebuildkite.Build {
	t.Helper()
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Org: "acme", Pipeline: pipeline, PipelineYAML: yaml})
	require.NoError(t, err)
	return b
}

// tokenFile writes content to a file, as the chart mounts the token's Secret.
func tokenFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	return path
}

// logs collects a logger's lines.
type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 1})
}

func (l *logs) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// start runs a Poller of cfg (against fake, with the test token unless cfg has a file)
// until the test ends.
func start(t *testing.T, fake *fakebuildkite.Server, cfg warmdemand.Config) (*warmdemand.Poller, *logs) {
	t.Helper()
	if cfg.TokenFile == "" {
		cfg.TokenFile = tokenFile(t, token+"\n")
	}
	if cfg.Queue == "" {
		cfg.Queue = "bk-operator"
	}
	cfg.Endpoint = fake.RESTEndpoint()
	cfg.Interval = interval
	if cfg.ShrinkDelay == 0 {
		cfg.ShrinkDelay = -1 // the pools follow each count: TestShrinksLate has the delay
	}
	l := &logs{}
	cfg.Log = l.logger()
	p, err := warmdemand.New(cfg)
	require.NoError(t, err)
	assert.True(t, p.NeedLeaderElection())
	assert.Equal(t, interval, p.RecheckAfter())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, p.Start(ctx))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return p, l
}

// env is an environment with a pool of size and, when maxSize >= 0, that ceiling.
func env(size, maxSize int32) *bkv1.BuildEnvironment {
	e := &bkv1.BuildEnvironment{}
	e.Name = fmt.Sprintf("pool-%d-%d", size, maxSize)
	e.Spec.WarmPool = &bkv1.WarmPool{Size: size}
	if maxSize >= 0 {
		e.Spec.WarmPool.MaxSize = &maxSize
	}
	return e
}

// settled asks p for e's size until why contains want and none of unwanted, and returns
// the size and why.
func settled(t *testing.T, p warmdemand.Sizer, e *bkv1.BuildEnvironment, want string, unwanted ...string) (int32, string) {
	t.Helper()
	var size int32
	var why string
	require.Eventually(t, func() bool {
		size, why = p.Desired(e)
		for _, u := range unwanted {
			if strings.Contains(why, u) {
				return false
			}
		}
		return strings.Contains(why, want)
	}, 10*time.Second, 10*time.Millisecond, "the last answer: %d, %q", size, why)
	return size, why
}

// The jobs counted are those waiting for an agent that agentd's slots could take: on its
// queue, with every other tag they ask for among agentd's; not those running, elsewhere,
// on the default queue, or in finished builds. Each pool follows the count between its
// size and its maxSize.
func TestCountsTheJobsWaitingOnTheQueue(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	taken := build(t, fake, "app", "steps:\n  - command: taken\n    agents: {queue: bk-operator}\n  - command: waits\n    agents: {queue: bk-operator}\n")
	job := fake.AcceptJobForTest(t, "agent-1", "queue=bk-operator")
	require.Equal(t, taken.Jobs[0], job.ID, "the first job runs, the second waits")
	build(t, fake, "app", `steps:
  - command: two waiting
    parallelism: 2
    agents: {queue: bk-operator}
  - command: tagged for this operator
    agents: {queue: bk-operator, cluster: gke-prod}
  - command: tagged for another operator
    agents: {queue: bk-operator, cluster: eks}
  - command: any os
    agents: ["queue=bk-operator", "os=linux*"]
  - command: another queue
    agents: {queue: other}
  - command: the default queue
`)
	finished := build(t, fake, "lib", "steps:\n  - command: canceled\n    agents: {queue: bk-operator}\n")
	require.NoError(t, fake.CancelJob(finished.Jobs[0]))

	p, logs := start(t, fake, warmdemand.Config{Organization: "acme", Tags: []string{"cluster=gke-prod", "os=linux-arm64", "queue=ignored"}})
	const waiting = 5 // waits, two waiting, tagged for this operator, any os
	for _, tc := range []struct {
		name          string
		size, maxSize int32
		want          int32
	}{
		{"between the floor and the ceiling", 1, 10, waiting},
		{"cut to the ceiling", 0, 2, 2},
		{"never below the floor", 6, 8, 6},
		{"a ceiling of exactly the count", 0, 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size, why := settled(t, p, env(tc.size, tc.maxSize), "jobs wait for an agent")
			assert.Equal(t, tc.want, size)
			assert.Equal(t, fmt.Sprintf(`%d jobs wait for an agent on queue "bk-operator": the pool keeps %d idle pods (its size is %d, its maxSize %d)`,
				waiting, tc.want, tc.size, tc.maxSize), why)
		})
	}
	size, why := p.Desired(env(3, -1))
	assert.Equal(t, int32(3), size, "a pool without maxSize is its size")
	assert.Empty(t, why)
	size, why = p.Desired(&bkv1.BuildEnvironment{})
	assert.Zero(t, size, "no pool")
	assert.Empty(t, why)

	// The count follows the queue: two more jobs wait, then one of them is canceled.
	more := build(t, fake, "app", "steps:\n  - command: a\n    agents: {queue: bk-operator}\n  - command: b\n    agents: {queue: bk-operator}\n")
	size, _ = settled(t, p, env(0, 20), fmt.Sprintf("%d jobs wait", waiting+2))
	assert.Equal(t, int32(waiting+2), size)
	require.NoError(t, fake.CancelJob(more.Jobs[0]))
	size, _ = settled(t, p, env(0, 20), fmt.Sprintf("%d jobs wait", waiting+1))
	assert.Equal(t, int32(waiting+1), size)
	assert.NotContains(t, logs.all(), token)
}

// With agentd's slots given, the count is cut there: jobs beyond them cannot be taken
// sooner than slots free up.
func TestCountCutAtTheSlots(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	build(t, fake, "app", "steps:\n  - command: a\n    parallelism: 6\n    agents: {queue: bk-operator}\n")
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme", Slots: 4})
	size, why := settled(t, p, env(1, 10), "6 jobs wait")
	assert.Equal(t, int32(4), size)
	assert.Contains(t, why, "the pool keeps 4 idle pods (its size is 1, its maxSize 10; agentd takes at most 4 jobs at a time)")
}

// A pool grows at once and shrinks only once fewer jobs have waited for ShrinkDelay: a
// warm pod deleted between two waves of jobs must be started again for the next.
func TestShrinksLate(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	wave := build(t, fake, "app", "steps:\n  - command: a\n    parallelism: 4\n    agents: {queue: bk-operator}\n")
	const delay = 8 * interval
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme", ShrinkDelay: delay})
	size, _ := settled(t, p, env(1, 10), "4 jobs wait")
	assert.Equal(t, int32(4), size)
	for _, id := range wave.Jobs[:3] {
		require.NoError(t, fake.CancelJob(id))
	}
	fell := time.Now()
	size, why := settled(t, p, env(1, 10), "1 job waits")
	assert.Equal(t, int32(4), size, "kept for the delay")
	assert.Contains(t, why, "the pool keeps 4 idle pods (its size is 1, its maxSize 10; 4 waited in the last 1.2s, and the pool shrinks once fewer have waited for that long)")
	size, why = settled(t, p, env(1, 10), "the pool keeps 1 idle pod ")
	assert.Equal(t, int32(1), size)
	assert.GreaterOrEqual(t, time.Since(fell), delay-2*interval, "not before the delay")
	assert.Equal(t, `1 job waits for an agent on queue "bk-operator": the pool keeps 1 idle pod (its size is 1, its maxSize 10)`, why)

	// It grows at once.
	build(t, fake, "app", "steps:\n  - command: b\n    parallelism: 2\n    agents: {queue: bk-operator}\n")
	size, _ = settled(t, p, env(1, 10), "3 jobs wait")
	assert.Equal(t, int32(3), size)
}

// With a cluster configured, only the jobs in the cluster's queue of agentd's queue key
// count: a queue of the same key in another cluster is another queue. Without one, every
// cluster's queue of that key counts.
func TestCountsOnlyTheClustersQueue(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds, warmdemand.ScopeReadClusters, warmdemand.ScopeReadOrganizations)
	rest := fake.REST()
	gke := rest.AddCluster("acme", "gke-prod")
	rest.AddCluster("acme", "other")
	for _, c := range []string{"gke-prod", "other"} {
		_, err := rest.AddQueue("acme", c, "bk-operator")
		require.NoError(t, err)
	}
	require.NoError(t, rest.SetPipelineCluster("acme", "app", "gke-prod"))
	require.NoError(t, rest.SetPipelineCluster("acme", "elsewhere", "other"))
	build(t, fake, "app", "steps:\n  - command: a\n    parallelism: 3\n    agents: {queue: bk-operator}\n")
	build(t, fake, "elsewhere", "steps:\n  - command: b\n    parallelism: 2\n    agents: {queue: bk-operator}\n")

	for _, tc := range []struct {
		name    string
		cfg     warmdemand.Config
		waiting int
	}{
		{"by name", warmdemand.Config{Organization: "acme", Cluster: "gke-prod"}, 3},
		{"by UUID, the organization found", warmdemand.Config{Cluster: gke}, 3},
		{"by a name in another case", warmdemand.Config{Organization: "acme", Cluster: "GKE-Prod"}, 3},
		{"no cluster: the queue key in any", warmdemand.Config{Organization: "acme"}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := start(t, fake, tc.cfg)
			size, _ := settled(t, p, env(0, 20), fmt.Sprintf("%d jobs wait", tc.waiting))
			assert.Equal(t, int32(tc.waiting), size)
		})
	}
}

// What keeps the pool at its floor, and says why in words that say what to fix, without
// the token: a token Buildkite refuses or that lacks a scope, an organization, cluster or
// queue that is not there, a token file that cannot be read, a refusal of the builds.
func TestProblemsKeepTheFloor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		scopes []string
		cfg    warmdemand.Config
		setup  func(t *testing.T, fake *fakebuildkite.Server)
		want   string
		// more is what else the message says, around what differs from run to run (UUIDs,
		// the fake's address).
		more []string
	}{
		{
			name: "no read_builds", scopes: []string{warmdemand.ScopeReadClusters},
			cfg:  warmdemand.Config{Organization: "acme"},
			want: "the Buildkite API token lacks the read_builds scope: read_builds lists the builds and their jobs. Add it to the token in Buildkite (Personal Settings > API Access Tokens)",
		},
		{
			name: "no read_clusters with a cluster", scopes: []string{warmdemand.ScopeReadBuilds},
			cfg:  warmdemand.Config{Organization: "acme", Cluster: "gke-prod"},
			want: `the Buildkite API token lacks the read_clusters scope: read_builds lists the builds and their jobs, read_clusters finds queue "bk-operator" in cluster "gke-prod". Add it`,
		},
		{
			name: "no organization and two scopes missing", scopes: []string{"read_pipelines"},
			cfg:  warmdemand.Config{},
			want: "lacks the read_builds and read_organizations scopes: read_builds lists the builds and their jobs, read_organizations finds the organization (give --buildkite-organization to need it no more). Add them",
		},
		{
			name: "a token Buildkite does not know", scopes: []string{warmdemand.ScopeReadBuilds},
			cfg:  warmdemand.Config{Organization: "acme", TokenFile: "unknown-token"},
			want: "Buildkite rejected the API token of --buildkite-api-token-file (GET v2/access-token: 401 Authentication required.",
		},
		{
			name: "an organization the token was not granted", scopes: []string{warmdemand.ScopeReadBuilds},
			cfg:   warmdemand.Config{Organization: "globex"},
			setup: func(t *testing.T, fake *fakebuildkite.Server) { fake.REST().AddOrganization("globex") },
			want:  `Buildkite has no organization "globex" that the API token reaches (GET v2/organizations/globex/builds: 404 No organization found): correct --buildkite-organization`,
		},
		{
			name: "the builds refused", scopes: []string{warmdemand.ScopeReadBuilds},
			cfg: warmdemand.Config{Organization: "acme"},
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTBuilds, Status: 403, Message: "Your IP address is not allowed"})
			},
			want: "Buildkite refused the API token (GET v2/organizations/acme/builds: 403 Your IP address is not allowed): it needs the read_builds scope and access to acme",
		},
		{
			name: "no such cluster", scopes: []string{warmdemand.ScopeReadBuilds, warmdemand.ScopeReadClusters},
			cfg: warmdemand.Config{Organization: "acme", Cluster: "eks"},
			want: `Buildkite organization acme has no cluster named "eks" or of that UUID (it has none): create it (Agents > Create a Cluster) with a queue "bk-operator" ` +
				"and give agentd an agent token of that cluster, or correct --buildkite-cluster",
		},
		{
			name: "no such queue in the cluster", scopes: []string{warmdemand.ScopeReadBuilds, warmdemand.ScopeReadClusters},
			cfg:   warmdemand.Config{Organization: "acme", Cluster: "gke-prod"},
			setup: func(t *testing.T, fake *fakebuildkite.Server) { fake.REST().AddCluster("acme", "gke-prod") },
			want:  `has no queue "bk-operator": agents of a cluster register only with one of its queues, so no slot of agentd can register. Create it (`,
			more:  []string{`cluster "gke-prod" (`, `/queues, New Queue, key "bk-operator"), or correct --queue, or --buildkite-cluster if agentd's agent token is of another cluster`},
		},
		{
			name: "two clusters of the name", scopes: []string{warmdemand.ScopeReadBuilds, warmdemand.ScopeReadClusters},
			cfg: warmdemand.Config{Organization: "acme", Cluster: "gke-prod"},
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				fake.REST().AddCluster("acme", "gke-prod")
				fake.REST().AddCluster("acme", "gke-prod")
			},
			want: `2 clusters of Buildkite organization acme are named "gke-prod" (UUIDs `,
			more: []string{"): give --buildkite-cluster the UUID of the one whose agent token agentd registers with"},
		},
		{
			name: "an empty token file", scopes: []string{warmdemand.ScopeReadBuilds},
			cfg:  warmdemand.Config{Organization: "acme", TokenFile: "\n"},
			want: "is empty (--buildkite-api-token-file): put the API token in that file",
		},
		{
			name: "no token file", scopes: []string{warmdemand.ScopeReadBuilds},
			cfg:  warmdemand.Config{Organization: "acme", TokenFile: "/nonexistent/token"},
			want: "reading the Buildkite API token file: open /nonexistent/token: no such file or directory (--buildkite-api-token-file)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := fakeOrg(t, tc.scopes...)
			build(t, fake, "app", "steps:\n  - command: a\n    parallelism: 4\n    agents: {queue: bk-operator}\n")
			if tc.setup != nil {
				tc.setup(t, fake)
			}
			switch tc.cfg.TokenFile {
			case "", "/nonexistent/token":
			default:
				tc.cfg.TokenFile = tokenFile(t, tc.cfg.TokenFile)
			}
			p, logs := start(t, fake, tc.cfg)
			size, why := settled(t, p, env(1, 10), "The pool stays at its size")
			assert.Equal(t, int32(1), size)
			assert.Contains(t, why, `The pool stays at its size, 1, rather than follow the jobs waiting on queue "bk-operator" up to its maxSize, 10: `)
			assert.Contains(t, why, tc.want)
			for _, m := range tc.more {
				assert.Contains(t, why, m)
			}
			assert.NotContains(t, why, token)
			require.Eventually(t, func() bool { return strings.Contains(logs.all(), "cannot follow") }, 5*time.Second, 10*time.Millisecond)
			assert.NotContains(t, logs.all(), token)
		})
	}
}

// A passing failure (a 5xx) keeps the last count for a few intervals, saying so, and the
// next good read mends it; a failure that lasts past them keeps the floor.
func TestPassingFailures(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	build(t, fake, "app", "steps:\n  - command: a\n    parallelism: 4\n    agents: {queue: bk-operator}\n")
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme"})
	settled(t, p, env(1, 10), "4 jobs wait")

	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTBuilds, Status: 502, Times: 1})
	size, why := settled(t, p, env(1, 10), "Reading them again failed")
	assert.Equal(t, int32(4), size, "the last count, still fresh")
	assert.Contains(t, why, "4 jobs wait")
	assert.Contains(t, why, "GET v2/organizations/acme/builds: 502 Injected fault: Bad Gateway")
	size, why = settled(t, p, env(1, 10), "4 jobs wait", "failed")
	assert.Equal(t, int32(4), size, "mended by the next read")
	assert.Equal(t, `4 jobs wait for an agent on queue "bk-operator": the pool keeps 4 idle pods (its size is 1, its maxSize 10)`, why)

	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTBuilds, Status: 503})
	size, why = settled(t, p, env(1, 10), "The pool stays at its size")
	assert.Equal(t, int32(1), size, "a count too old is not used")
	assert.Contains(t, why, "Buildkite's REST API failed (GET v2/organizations/acme/builds: 503")
}

// A 429 stops the polls until the window resets (go-buildkite would retry it for minutes);
// meanwhile the last count serves while it is fresh, and then the floor, saying why.
func TestRateLimited(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	build(t, fake, "app", "steps:\n  - command: a\n    parallelism: 3\n    agents: {queue: bk-operator}\n")
	fake.REST().SetRateLimit(20, time.Minute)
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme"})
	settled(t, p, env(0, 10), "3 jobs wait")

	// The organization's other clients spend the rest of the window.
	for {
		req, err := http.NewRequest(http.MethodGet, fake.RESTEndpoint()+"v2/access-token", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			break
		}
	}
	size, why := settled(t, p, env(0, 10), "rate limit")
	assert.Contains(t, why, "Buildkite's REST API rate limit of the organization is spent (429 Too Many Requests, the window resets in 1m0s): the queue is read again once the window resets")
	if strings.Contains(why, "3 jobs wait") {
		assert.Equal(t, int32(3), size, "the last count, while fresh")
	}
	calls := fake.RequestCount(fakebuildkite.EPRESTBuilds, "")
	size, _ = settled(t, p, env(0, 10), "The pool stays at its size")
	assert.Zero(t, size, "the floor, once the count is old")
	time.Sleep(3 * interval)
	p.Desired(env(0, 10))
	assert.Equal(t, calls, fake.RequestCount(fakebuildkite.EPRESTBuilds, ""), "no call until the window resets")
}

// Below a tenth of the organization's calls left, the Poller waits for the next window,
// without ever being answered 429: the calls are the organization's other clients' too.
func TestLeavesTheLastCallsToOthers(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	build(t, fake, "app", "steps:\n  - command: a\n    agents: {queue: bk-operator}\n")
	fake.REST().SetRateLimit(2, time.Minute) // the token check and one count spend it
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme"})
	settled(t, p, env(0, 10), "1 job waits")
	for range 5 {
		time.Sleep(interval)
		_, why := p.Desired(env(0, 10))
		assert.Contains(t, why, "1 job waits")
	}
	assert.Equal(t, 1, fake.RequestCount(fakebuildkite.EPRESTBuilds, ""))
	for _, r := range fake.Requests() {
		assert.NotEqual(t, 429, r.Status, "%s %s", r.Method, r.Path)
	}
}

// The count is cached: however often pools ask, Buildkite is read once an interval, and
// not at all while no pool that follows demand asks.
func TestReadsOnceAnInterval(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	build(t, fake, "app", "steps:\n  - command: a\n    agents: {queue: bk-operator}\n")
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme"})

	// A pool without maxSize does not wake the poller.
	for range 20 {
		p.Desired(env(2, -1))
		time.Sleep(10 * time.Millisecond)
	}
	assert.Zero(t, fake.RequestCount(fakebuildkite.EPRESTBuilds, ""), "no pool follows demand")

	settled(t, p, env(0, 5), "1 job waits")
	first := fake.RequestCount(fakebuildkite.EPRESTBuilds, "")
	asks := 0
	for deadline := time.Now().Add(10 * interval); time.Now().Before(deadline); asks++ {
		p.Desired(env(0, 5))
		time.Sleep(5 * time.Millisecond)
	}
	polls := fake.RequestCount(fakebuildkite.EPRESTBuilds, "") - first
	assert.Greater(t, asks, 100)
	assert.GreaterOrEqual(t, polls, 7, "about one poll an interval")
	assert.LessOrEqual(t, polls, 11, "about one poll an interval")
	assert.Equal(t, 1, fake.RequestCount(fakebuildkite.EPRESTAccessToken, ""), "the token is checked once")

	// Nobody asks: the polls stop after askedWithin intervals, and start again when one does.
	time.Sleep(5 * interval)
	idle := fake.RequestCount(fakebuildkite.EPRESTBuilds, "")
	time.Sleep(5 * interval)
	assert.Equal(t, idle, fake.RequestCount(fakebuildkite.EPRESTBuilds, ""), "no pool asked")
	p.Desired(env(0, 5))
	require.Eventually(t, func() bool { return fake.RequestCount(fakebuildkite.EPRESTBuilds, "") > idle }, 5*time.Second, 10*time.Millisecond)
}

// Before the first read the pool keeps its floor, and says it waits for one.
func TestBeforeTheFirstRead(t *testing.T) {
	fake := fakeOrg(t, warmdemand.ScopeReadBuilds)
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTAccessToken, Latency: time.Second})
	p, _ := start(t, fake, warmdemand.Config{Organization: "acme"})
	size, why := p.Desired(env(2, 6))
	assert.Equal(t, int32(2), size)
	assert.Equal(t, `The pool keeps its size, 2, until the jobs waiting on queue "bk-operator" are read from Buildkite (it follows them up to its maxSize, 6)`, why)
}

// Without a token every pool keeps its size, and one with a maxSize says why.
func TestNoToken(t *testing.T) {
	var s warmdemand.Sizer = warmdemand.NoToken{}
	size, why := s.Desired(env(2, 7))
	assert.Equal(t, int32(2), size)
	assert.Equal(t, "The pool stays at its size, 2: spec.warmPool.maxSize (7) has it follow the jobs waiting on the operator's queue, but the operator has no Buildkite API token to read them. "+
		"Give agentd one with the read_builds scope (--buildkite-api-token-file; the chart's buildkite.preflight.apiTokenSecret)", why)
	size, why = s.Desired(env(3, -1))
	assert.Equal(t, int32(3), size)
	assert.Empty(t, why)
	assert.Zero(t, s.RecheckAfter())
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  warmdemand.Config
		want string
	}{
		{"the default interval", warmdemand.Config{Queue: "q", TokenFile: "f"}, ""},
		{"10s", warmdemand.Config{Queue: "q", TokenFile: "f", Interval: 10 * time.Second}, ""},
		{"too often", warmdemand.Config{Queue: "q", TokenFile: "f", Interval: 5 * time.Second}, "is below 10s: Buildkite allows an organization 200 REST API calls a minute"},
		{"no queue", warmdemand.Config{TokenFile: "f"}, "give agentd's --queue"},
		{"no token", warmdemand.Config{Queue: "q"}, "size pools with NoToken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
