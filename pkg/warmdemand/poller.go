package warmdemand

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
)

const (
	// DefaultInterval is how often the waiting jobs are read: 2 calls a minute, 1% of the
	// 200 an organization has, and soon enough that a pool grows while a wave of jobs is
	// still waiting (a warm pod takes seconds to start; a queue backs up for minutes).
	DefaultInterval = 30 * time.Second
	// MinInterval is the shortest interval Config.Validate takes: at 10 s, the largest
	// poll (maxPages calls) takes 15% of the organization's calls.
	MinInterval = 10 * time.Second
	// DefaultShrinkDelay is how long a pool keeps the pods of a count that has fallen: a
	// queue's waiting jobs come and go in waves, and a warm pod deleted between two of them
	// must be started again for the next, so pools grow at once and shrink only when fewer
	// jobs have waited for this long (Kubernetes' autoscalers wait so before they shrink).
	DefaultShrinkDelay = 2 * time.Minute

	// pageSize is the REST API's largest page.
	pageSize = preflight.MaxPageSize
	// maxPages bounds a poll: the newest 500 builds that may hold a waiting job. A queue
	// whose waiting jobs are spread over more builds than that is counted short, and the
	// message says so.
	maxPages = 5
	// staleAfter, in intervals, is how long a count is used while polls fail for a
	// passing reason (a 5xx, a 429, a connection): one failed poll does not shrink pools.
	staleAfter = 3
	// askedWithin, in intervals, is how long the Poller keeps polling after a pool that
	// follows demand last asked for its size.
	askedWithin = 3
	// requestTimeout bounds one call.
	requestTimeout = 10 * time.Second
	// reserveFraction: below this share of its calls left in the window, the Poller waits
	// for the next window and leaves the rest to the organization's other clients.
	reserveFraction = 10
)

// Scopes of the API token that following demand needs.
const (
	// ScopeReadBuilds lists the builds and their jobs: always needed.
	ScopeReadBuilds = "read_builds"
	// ScopeReadClusters finds the cluster's queue, with Config.Cluster (the start-up check
	// needs it too); ScopeReadOrganizations finds the organization without
	// Config.Organization.
	ScopeReadClusters      = preflight.ScopeReadClusters
	ScopeReadOrganizations = preflight.ScopeReadOrganizations
)

// Config is what the Poller reads, as agentd's flags say.
type Config struct {
	// TokenFile holds the Buildkite API access token (--buildkite-api-token-file). It is
	// read at every poll, so that a token renewed in its Secret is taken up.
	TokenFile string
	// Endpoint is the REST API (--buildkite-api-endpoint); preflight.DefaultEndpoint when empty.
	Endpoint string
	// Organization is the organization's slug; the one the token reaches when empty.
	Organization string
	// Cluster is the name or UUID of the Buildkite cluster agentd registers in; without
	// it, waiting jobs are matched by their queue rule in any cluster.
	Cluster string
	// Queue is agentd's queue key (--queue); Tags its other agent tags (--tags).
	Queue string
	Tags  []string
	// Slots is agentd's slot count: waiting jobs beyond it cannot be taken sooner than
	// slots free up, so the count is cut there. 0: not cut.
	Slots int
	// Interval is how often the jobs are read; DefaultInterval when 0.
	Interval time.Duration
	// ShrinkDelay is how long a pool keeps the pods of a count that has fallen: the size
	// follows the most jobs that waited in it. DefaultShrinkDelay when 0; none when
	// negative.
	ShrinkDelay time.Duration
	// UserAgent is sent with every call.
	UserAgent string
	// Transport makes the calls; http.DefaultTransport when nil.
	Transport http.RoundTripper
	Log       logr.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Validate refuses what agentd's flags must not give: an interval that would spend the
// organization's REST API calls, or no queue. (New takes any interval, for tests.)
func (c *Config) Validate() error {
	if c.Interval != 0 && c.Interval < MinInterval {
		return fmt.Errorf("the interval of reading the queue's waiting jobs, %s, is below %s: Buildkite allows an organization 200 REST API calls a minute, for every tool it uses", c.Interval, MinInterval)
	}
	return c.validateQueue()
}

func (c *Config) validateQueue() error {
	if c.Queue == "" {
		return errors.New("the queue whose waiting jobs size warm pools is empty: give agentd's --queue")
	}
	if c.TokenFile == "" {
		return errors.New("no Buildkite API token file: without --buildkite-api-token-file, size pools with NoToken")
	}
	return nil
}

// Poller reads the waiting jobs, caches the count, and sizes pools from it. It is a
// controller-runtime manager Runnable, run on the leader, which keeps the pools.
type Poller struct {
	cfg    Config
	target target
	wake   chan struct{}

	mu sync.Mutex
	// count is the last count read, and when; ok is false until one is.
	count     count
	countedAt time.Time
	ok        bool
	// recent are the counts read within ShrinkDelay, oldest first.
	recent []sample
	// problem is why the last poll failed ("" when it did not); lasting is true when
	// waiting will not mend it (a token Buildkite refuses, a scope or queue missing).
	problem string
	lasting bool
	// resolved are the organization and queue UUID, found once.
	resolved *resolved
	// lastPoll and holdUntil time the next poll; asked is when a pool that follows demand
	// last asked for its size.
	lastPoll, holdUntil, asked time.Time
}

// count is what one poll found.
type count struct {
	// waiting is how many jobs wait that agentd could take.
	waiting int
	// short: more builds may hold waiting jobs than one poll reads.
	short bool
}

// sample is a count of waiting jobs, and when it was read.
type sample struct {
	at      time.Time
	waiting int
}

// resolved is what a poll needs to have found once.
type resolved struct {
	org     string
	queueID string
}

// New returns a Poller of cfg; add it to the manager to have it poll.
func New(cfg Config) (*Poller, error) {
	if err := cfg.validateQueue(); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.ShrinkDelay == 0 {
		cfg.ShrinkDelay = DefaultShrinkDelay
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Transport == nil {
		cfg.Transport = http.DefaultTransport
	}
	return &Poller{cfg: cfg, target: newTarget(cfg.Queue, cfg.Tags), wake: make(chan struct{}, 1)}, nil
}

// NeedLeaderElection is true: only the leader keeps pools, and one poller per operator
// spends the organization's calls.
func (p *Poller) NeedLeaderElection() bool { return true }

// RecheckAfter is the poll interval.
func (p *Poller) RecheckAfter() time.Duration { return p.cfg.Interval }

// Desired is env's pool size: the waiting jobs, cut to the pool's floor and ceiling, or
// the floor when they cannot be read (why says why).
func (p *Poller) Desired(env *bkv1.BuildEnvironment) (int32, string) {
	w := env.Spec.WarmPool
	floor, ceiling := w.Floor(), w.Ceiling()
	if !w.FollowsDemand() {
		return floor, ""
	}
	now := p.cfg.Now()
	p.mu.Lock()
	p.asked = now
	c, countedAt, ok, problem, lasting := p.count, p.countedAt, p.ok, p.problem, p.lasting
	most := p.mostRecentLocked(now)
	p.mu.Unlock()
	select { // the poller sleeps while no pool asks: this wakes it
	case p.wake <- struct{}{}:
	default:
	}

	fresh := ok && now.Sub(countedAt) <= staleAfter*p.cfg.Interval
	switch {
	case problem != "" && (lasting || !fresh):
		return floor, fmt.Sprintf("The pool stays at its size, %d, rather than follow the jobs waiting on queue %q up to its maxSize, %d: %s",
			floor, p.cfg.Queue, ceiling, problem)
	case !ok:
		return floor, fmt.Sprintf("The pool keeps its size, %d, until the jobs waiting on queue %q are read from Buildkite (it follows them up to its maxSize, %d)",
			floor, p.cfg.Queue, ceiling)
	}
	cut := func(n int) int32 { // to agentd's slots, then to the pool's bounds
		if p.cfg.Slots > 0 {
			n = min(n, p.cfg.Slots)
		}
		return clamp(n, floor, ceiling)
	}
	wanted := max(c.waiting, most)
	size := cut(wanted)
	why := fmt.Sprintf("%d %s for an agent on queue %q: the pool keeps %d idle %s (its size is %d, its maxSize %d",
		c.waiting, plural(c.waiting, "job waits", "jobs wait"), p.cfg.Queue, size, plural(int(size), "pod", "pods"), floor, ceiling)
	if size > cut(c.waiting) {
		why += fmt.Sprintf("; %d waited in the last %s, and the pool shrinks once fewer have waited for that long", most, p.cfg.ShrinkDelay)
	}
	if size < clamp(wanted, floor, ceiling) {
		why += fmt.Sprintf("; agentd takes at most %d jobs at a time", p.cfg.Slots)
	}
	why += ")"
	if c.short {
		why += fmt.Sprintf("; counted in the newest %d builds that may hold one, and there are more", maxPages*pageSize)
	}
	if problem != "" {
		why += fmt.Sprintf(". Reading them again failed, so this is the count of %s: %s", countedAt.UTC().Format(time.RFC3339), problem)
	}
	return size, why
}

// Start polls until ctx ends, while pools ask: the loop sleeps when none has asked for
// askedWithin intervals, and Desired wakes it.
func (p *Poller) Start(ctx context.Context) error {
	for {
		wait, due := p.nextPoll()
		if due {
			p.poll(ctx)
			continue
		}
		var timer *time.Timer
		var fired <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			fired = timer.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		case <-fired:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// nextPoll says whether a poll is due, or how long to wait for one (0: until woken).
func (p *Poller) nextPoll() (time.Duration, bool) {
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.asked.IsZero() || now.Sub(p.asked) > askedWithin*p.cfg.Interval {
		return 0, false
	}
	next := p.holdUntil
	if !p.lastPoll.IsZero() && p.lastPoll.Add(p.cfg.Interval).After(next) {
		next = p.lastPoll.Add(p.cfg.Interval)
	}
	if wait := next.Sub(now); wait > 0 {
		return wait, false
	}
	return 0, true
}

// poll reads the waiting jobs once and records the count, or why it could not.
func (p *Poller) poll(ctx context.Context) {
	p.mu.Lock()
	p.lastPoll = p.cfg.Now()
	res := p.resolved
	p.mu.Unlock()

	c, res, budget, err := p.read(ctx, res)

	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resolved = res
	if wait := budget.hold(); wait > 0 {
		p.holdUntil = now.Add(wait)
	}
	if err != nil {
		msg, lasting := describe(err, p.cfg)
		if msg != p.problem {
			p.cfg.Log.Info("warm pools cannot follow the queue's waiting jobs: "+msg, "queue", p.cfg.Queue, "lasting", lasting)
		}
		p.problem, p.lasting = msg, lasting
		return
	}
	if p.problem != "" || !p.ok || c != p.count {
		p.cfg.Log.V(1).Info("warm pools follow the queue's waiting jobs", "queue", p.cfg.Queue, "waiting", c.waiting, "short", c.short)
	}
	p.count, p.countedAt, p.ok = c, now, true
	p.problem, p.lasting = "", false
	p.recent = append(p.recent, sample{at: now, waiting: c.waiting})
	p.mostRecentLocked(now) // forgets the samples past ShrinkDelay
}

// mostRecentLocked is the most jobs that waited in a count of the last ShrinkDelay; it
// forgets older counts.
func (p *Poller) mostRecentLocked(now time.Time) int {
	most := 0
	keep := p.recent[:0]
	for _, s := range p.recent {
		if p.cfg.ShrinkDelay < 0 || now.Sub(s.at) > p.cfg.ShrinkDelay {
			continue
		}
		keep = append(keep, s)
		most = max(most, s.waiting)
	}
	p.recent = keep
	return most
}

// readToken reads the token file as the start-up check does: the whole file, trimmed.
func readToken(path string) (string, error) {
	token, err := preflight.ReadAPIToken(path)
	if err != nil {
		return "", &tokenFileError{err: err}
	}
	return token, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
