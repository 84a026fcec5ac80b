package warmdemand

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/buildkite/go-buildkite/v4"

	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
)

// pollTimeout bounds a whole poll, however many calls it makes.
const pollTimeout = 30 * time.Second

// buildStates are the states of builds that may hold a job waiting for an agent
// (Buildkite's build states: a failing build still runs its other jobs).
var buildStates = []string{"scheduled", "running", "failing"}

// readBuilds is the scope the count needs, beyond those of finding the organization and
// queue (preflight.Needs).
var readBuilds = preflight.Need{Scope: ScopeReadBuilds, For: "lists the builds and their jobs"}

// read makes one poll's calls: what it must find once (res, when nil), then the count. It
// returns what it found, the rate-limit budget the last answer told, and why it failed.
func (p *Poller) read(ctx context.Context, res *resolved) (count, *resolved, budget, error) {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	token, err := readToken(p.cfg.TokenFile)
	if err != nil {
		return count{}, res, budget{}, err
	}
	tr := &rateTransport{base: p.cfg.Transport}
	bk, err := preflight.NewClient(p.cfg.Endpoint, token, p.cfg.UserAgent, &http.Client{Transport: tr, Timeout: requestTimeout})
	if err != nil {
		return count{}, res, budget{}, err
	}
	if res == nil {
		// The start-up check's lookup, so that both find the same organization and queue,
		// and say the same of what they cannot find.
		found, err := preflight.Lookup(ctx, bk, p.cfg.lookup(), readBuilds)
		if err != nil {
			return count{}, nil, tr.last(), err
		}
		res = &resolved{org: found.Organization, queueID: found.Queue.ID}
	}
	c, err := p.countWaiting(ctx, bk, *res)
	if preflight.StatusOf(err) == http.StatusNotFound {
		res = nil // the organization went away, or the token lost it: find it again
	}
	return c, res, tr.last(), err
}

// countWaiting lists the builds that may hold a waiting job, newest first, with their
// jobs, and counts the waiting jobs agentd could take.
func (p *Poller) countWaiting(ctx context.Context, bk *buildkite.Client, res resolved) (count, error) {
	t := p.target
	t.queueID = res.queueID
	n := 0
	short, err := preflight.Paginate(ctx, pageSize, maxPages, func(o buildkite.ListOptions) (*buildkite.Response, error) {
		builds, resp, err := bk.Builds.ListByOrg(ctx, res.org, &buildkite.BuildsListOptions{State: buildStates, ExcludePipeline: true, ListOptions: o})
		for _, b := range builds {
			for _, j := range b.Jobs {
				if t.waits(j) {
					n++
				}
			}
		}
		return resp, err
	})
	if err != nil {
		return count{}, preflight.CallError("GET v2/organizations/"+res.org+"/builds", err)
	}
	return count{waiting: n, short: short}, nil
}

// lookup is what the Poller finds once: the organization and, with a cluster, its queue.
func (c *Config) lookup() preflight.Config {
	return preflight.Config{Organization: c.Organization, Cluster: c.Cluster, Queue: c.Queue}
}

// scopes are the scopes the token needs for c.
func (c *Config) scopes() []string {
	return preflight.Scopes(preflight.Needs(c.lookup(), readBuilds))
}

// budget is what the REST API said of the organization's rate limit in its last answer.
type budget struct {
	known            bool
	limit, remaining int
	reset            time.Duration
	// limited: the answer was a 429.
	limited bool
}

// hold is how long to wait before the next poll, beyond the interval: until the window
// resets after a 429, or when less than a tenth of the calls are left in it.
func (b budget) hold() time.Duration {
	switch {
	case b.limited:
		return max(b.reset, time.Second)
	case b.known && b.limit > 0 && b.remaining*reserveFraction < b.limit:
		return b.reset
	}
	return 0
}

func budgetOf(h http.Header) budget {
	limit, err1 := strconv.Atoi(h.Get("RateLimit-Limit"))
	remaining, err2 := strconv.Atoi(h.Get("RateLimit-Remaining"))
	reset, err3 := strconv.Atoi(h.Get("RateLimit-Reset"))
	if err1 != nil || err2 != nil || err3 != nil {
		return budget{}
	}
	return budget{known: true, limit: limit, remaining: remaining, reset: time.Duration(reset) * time.Second}
}

// rateTransport notes the rate-limit headers of every answer, and turns a 429 into an
// error: go-buildkite retries a 429 itself, with backoff, for up to 15 minutes and past
// the poll's deadline, where the Poller should rather wait for the window to reset.
type rateTransport struct {
	base http.RoundTripper
	mu   sync.Mutex
	b    budget
}

func (t *rateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	b := budgetOf(resp.Header)
	if resp.StatusCode == http.StatusTooManyRequests {
		b.limited = true
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		t.note(b)
		return nil, &rateLimitedError{reset: b.reset}
	}
	t.note(b)
	return resp, nil
}

func (t *rateTransport) note(b budget) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b.known || b.limited {
		t.b = b
	}
}

func (t *rateTransport) last() budget {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b
}

// The errors of a poll, besides those of preflight (*preflight.APIError of a call,
// *preflight.LookupError of the lookup), each described for a person by describe.
type (
	// tokenFileError: the token file cannot be read.
	tokenFileError struct{ err error }
	// rateLimitedError: Buildkite answered 429.
	rateLimitedError struct{ reset time.Duration }
)

func (e *tokenFileError) Error() string {
	return "reading the Buildkite API token file: " + e.err.Error()
}
func (e *tokenFileError) Unwrap() error { return e.err }
func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("429 Too Many Requests, the window resets in %s", e.reset)
}

// describe says what went wrong and what to do, for status.warmPool.message and the log;
// lasting is true when waiting will not mend it. It is made of the configuration and
// Buildkite's answers only: never of the token.
func describe(err error, cfg Config) (msg string, lasting bool) {
	var (
		tf  *tokenFileError
		le  *preflight.LookupError
		rl  *rateLimitedError
		ae  *preflight.APIError
		org = cfg.Organization
	)
	if org == "" {
		org = "the organization agentd registers in"
	}
	needs := strings.Join(cfg.scopes(), " and ")
	switch {
	case errors.As(err, &tf):
		return fmt.Sprintf("%v (--buildkite-api-token-file): put the API token in that file (the chart mounts it from buildkite.preflight.apiTokenSecret)", tf), true
	case errors.As(err, &le):
		return le.Finding.Message, true
	case errors.As(err, &rl):
		return fmt.Sprintf("Buildkite's REST API rate limit of the organization is spent (%v): the queue is read again once the window resets", rl), false
	case errors.As(err, &ae) && ae.Status != 0:
		switch ae.Status {
		case http.StatusUnauthorized:
			return fmt.Sprintf("Buildkite rejected the API token of --buildkite-api-token-file (%v): it is not a valid API access token, or it was revoked or has expired. Give one with the %s %s and access to %s",
				ae, needs, plural(len(cfg.scopes()), "scope", "scopes"), org), true
		case http.StatusForbidden:
			return fmt.Sprintf("Buildkite refused the API token (%v): it needs the %s %s and access to %s (the token's Organization Access; the organization may also allow API access only from some IP addresses)",
				ae, needs, plural(len(cfg.scopes()), "scope", "scopes"), org), true
		case http.StatusNotFound:
			if cfg.Organization == "" {
				return fmt.Sprintf("Buildkite no longer shows the organization the API token reached (%v): grant the token access to %s again, or give --buildkite-organization", ae, org), true
			}
			return fmt.Sprintf("Buildkite has no organization %q that the API token reaches (%v): correct --buildkite-organization (the slug in https://buildkite.com/organizations/<slug>), or grant the token access to it", cfg.Organization, ae), true
		}
		return fmt.Sprintf("Buildkite's REST API failed (%v)", ae), false
	}
	return fmt.Sprintf("Buildkite's REST API at %s did not answer (%v)", preflight.BaseURL(cfg.Endpoint), err), false
}
