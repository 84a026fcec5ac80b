package warmdemand

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/buildkite/go-buildkite/v4"

	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
)

// pollTimeout bounds a whole poll, however many calls it makes.
const pollTimeout = 30 * time.Second

// maxListPages bounds the organizations and clusters listings a poll makes to find its
// organization and queue (once): 2000 at the largest page.
const maxListPages = 20

// buildStates are the states of builds that may hold a job waiting for an agent
// (Buildkite's build states: a failing build still runs its other jobs).
var buildStates = []string{"scheduled", "running", "failing"}

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
	opts := []buildkite.ClientOpt{
		buildkite.WithBaseURL(preflight.BaseURL(p.cfg.Endpoint)),
		buildkite.WithTokenAuth(token),
		buildkite.WithHTTPClient(&http.Client{Transport: tr, Timeout: requestTimeout}),
	}
	if p.cfg.UserAgent != "" {
		opts = append(opts, buildkite.WithUserAgent(p.cfg.UserAgent))
	}
	bk, err := buildkite.NewClient(opts...)
	if err != nil {
		return count{}, res, budget{}, fmt.Errorf("making the Buildkite REST API client: %w", err)
	}
	if res == nil {
		if res, err = p.resolve(ctx, bk); err != nil {
			return count{}, nil, tr.last(), err
		}
	}
	c, err := p.countWaiting(ctx, bk, *res)
	if statusOf(err) == http.StatusNotFound {
		res = nil // the organization went away, or the token lost it: find it again
	}
	return c, res, tr.last(), err
}

// resolve checks the token's scopes and finds the organization and, with a cluster, the
// UUID of agentd's queue in it.
func (p *Poller) resolve(ctx context.Context, bk *buildkite.Client) (*resolved, error) {
	tok, _, err := bk.AccessTokens.Get(ctx)
	if err != nil {
		return nil, apiError("GET v2/access-token", err)
	}
	var missing []string
	for _, s := range p.cfg.scopes() {
		if !slices.Contains(tok.Scopes, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		return nil, &scopeError{missing: missing}
	}
	res := &resolved{org: p.cfg.Organization}
	if res.org == "" {
		orgs, err := listAll(ctx, func(o buildkite.ListOptions) ([]buildkite.Organization, *buildkite.Response, error) {
			return bk.Organizations.List(ctx, &buildkite.OrganizationListOptions{ListOptions: o})
		})
		if err != nil {
			return nil, apiError("GET v2/organizations", err)
		}
		if len(orgs) != 1 {
			return nil, &findError{fmt.Sprintf(
				"the Buildkite API token reaches %d organizations, not one: give --buildkite-organization the slug of the one agentd registers in", len(orgs))}
		}
		res.org = orgs[0].Slug
	}
	if p.cfg.Cluster == "" {
		return res, nil
	}
	clusters, err := listAll(ctx, func(o buildkite.ListOptions) ([]buildkite.Cluster, *buildkite.Response, error) {
		return bk.Clusters.List(ctx, res.org, &buildkite.ClustersListOptions{ListOptions: o})
	})
	if err != nil {
		return nil, apiError("GET v2/organizations/"+res.org+"/clusters", err)
	}
	cluster, err := p.findCluster(res.org, clusters)
	if err != nil {
		return nil, err
	}
	queues, err := listAll(ctx, func(o buildkite.ListOptions) ([]buildkite.ClusterQueue, *buildkite.Response, error) {
		return bk.ClusterQueues.List(ctx, res.org, cluster.ID, &buildkite.ClusterQueuesListOptions{ListOptions: o})
	})
	if err != nil {
		return nil, apiError("GET v2/organizations/"+res.org+"/clusters/"+cluster.ID+"/queues", err)
	}
	for _, q := range queues {
		if q.Key == p.cfg.Queue {
			res.queueID = q.ID
			return res, nil
		}
	}
	return nil, &findError{fmt.Sprintf("cluster %q (%s) of Buildkite organization %s has no queue %q: create it, or correct --queue or --buildkite-cluster",
		cluster.Name, cluster.ID, res.org, p.cfg.Queue)}
}

// findCluster is the configured cluster: by UUID, else by name (a difference of case
// alone is taken as a match, as the start-up check takes it).
func (p *Poller) findCluster(org string, clusters []buildkite.Cluster) (buildkite.Cluster, error) {
	var byName []buildkite.Cluster
	for _, c := range clusters {
		if strings.EqualFold(c.ID, p.cfg.Cluster) {
			return c, nil
		}
		if strings.EqualFold(c.Name, p.cfg.Cluster) {
			byName = append(byName, c)
		}
	}
	if exact := slices.DeleteFunc(slices.Clone(byName), func(c buildkite.Cluster) bool { return c.Name != p.cfg.Cluster }); len(exact) > 0 {
		byName = exact
	}
	switch len(byName) {
	case 1:
		return byName[0], nil
	case 0:
		return buildkite.Cluster{}, &findError{fmt.Sprintf("Buildkite organization %s has no cluster named %q or of that UUID: correct --buildkite-cluster", org, p.cfg.Cluster)}
	}
	return buildkite.Cluster{}, &findError{fmt.Sprintf("%d clusters of Buildkite organization %s are named %q: give --buildkite-cluster the UUID of the one agentd registers in", len(byName), org, p.cfg.Cluster)}
}

// countWaiting lists the builds that may hold a waiting job, newest first, with their
// jobs, and counts the waiting jobs agentd could take.
func (p *Poller) countWaiting(ctx context.Context, bk *buildkite.Client, res resolved) (count, error) {
	t := p.target
	t.queueID = res.queueID
	opt := &buildkite.BuildsListOptions{State: buildStates, ExcludePipeline: true, ListOptions: buildkite.ListOptions{Page: 1, PerPage: pageSize}}
	n := 0
	for range maxPages {
		builds, resp, err := bk.Builds.ListByOrg(ctx, res.org, opt)
		if err != nil {
			return count{}, apiError("GET v2/organizations/"+res.org+"/builds", err)
		}
		for _, b := range builds {
			for _, j := range b.Jobs {
				if t.waits(j) {
					n++
				}
			}
		}
		if resp == nil || resp.NextPage == 0 || resp.NextPage == opt.Page {
			return count{waiting: n}, nil
		}
		opt.Page = resp.NextPage
	}
	return count{waiting: n, short: true}, nil
}

// scopes are the scopes the token needs for c.
func (c *Config) scopes() []string {
	s := []string{ScopeReadBuilds}
	if c.Cluster != "" {
		s = append(s, ScopeReadClusters)
	}
	if c.Organization == "" {
		s = append(s, ScopeReadOrganizations)
	}
	return s
}

// listAll follows a listing's pages, up to maxListPages.
func listAll[T any](ctx context.Context, list func(buildkite.ListOptions) ([]T, *buildkite.Response, error)) ([]T, error) {
	var all []T
	opt := buildkite.ListOptions{Page: 1, PerPage: pageSize}
	for range maxListPages {
		if err := ctx.Err(); err != nil {
			return all, err
		}
		items, resp, err := list(opt)
		if err != nil {
			return all, err
		}
		all = append(all, items...)
		if resp == nil || resp.NextPage == 0 || resp.NextPage == opt.Page {
			break
		}
		opt.Page = resp.NextPage
	}
	return all, nil
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

// The errors of a poll, each described for a person by describe.
type (
	// tokenFileError: the token file cannot be read.
	tokenFileError struct{ err error }
	// scopeError: the token lacks scopes.
	scopeError struct{ missing []string }
	// findError: the organization, cluster or queue cannot be found.
	findError struct{ msg string }
	// rateLimitedError: Buildkite answered 429.
	rateLimitedError struct{ reset time.Duration }
	// statusError: Buildkite answered another error status.
	statusError struct {
		call    string
		status  int
		message string
	}
)

func (e *tokenFileError) Error() string {
	return "reading the Buildkite API token file: " + e.err.Error()
}
func (e *tokenFileError) Unwrap() error { return e.err }
func (e *scopeError) Error() string {
	return "the Buildkite API token lacks " + strings.Join(e.missing, " and ")
}
func (e *findError) Error() string { return e.msg }
func (e *rateLimitedError) Error() string {
	return fmt.Sprintf("429 Too Many Requests, the window resets in %s", e.reset)
}
func (e *statusError) Error() string {
	msg := e.message
	if msg == "" {
		msg = http.StatusText(e.status)
	}
	return fmt.Sprintf("%s: %d %s", e.call, e.status, msg)
}

// apiError keeps Buildkite's answer (status and message) when there was one.
func apiError(call string, err error) error {
	var er *buildkite.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		return &statusError{call: call, status: er.Response.StatusCode, message: er.Message}
	}
	return fmt.Errorf("%s: %w", call, err)
}

func statusOf(err error) int {
	var se *statusError
	if errors.As(err, &se) {
		return se.status
	}
	return 0
}

// describe says what went wrong and what to do, for status.warmPool.message and the log;
// lasting is true when waiting will not mend it. It is made of the configuration and
// Buildkite's answers only: never of the token.
func describe(err error, cfg Config) (msg string, lasting bool) {
	var (
		tf  *tokenFileError
		se  *scopeError
		fe  *findError
		rl  *rateLimitedError
		st  *statusError
		org = cfg.Organization
	)
	if org == "" {
		org = "the organization agentd registers in"
	}
	needs := strings.Join(cfg.scopes(), " and ")
	switch {
	case errors.As(err, &tf):
		return fmt.Sprintf("%v (--buildkite-api-token-file): put the API token in that file (the chart mounts it from buildkite.preflight.apiTokenSecret)", tf), true
	case errors.As(err, &se):
		msg := fmt.Sprintf("the Buildkite API token lacks the %s %s: %s lists the builds and their jobs", strings.Join(se.missing, " and "), plural(len(se.missing), "scope", "scopes"), ScopeReadBuilds)
		if cfg.Cluster != "" {
			msg += fmt.Sprintf(", %s finds queue %q in cluster %q", ScopeReadClusters, cfg.Queue, cfg.Cluster)
		}
		if cfg.Organization == "" {
			msg += fmt.Sprintf(", %s finds the organization (give --buildkite-organization to need it no more)", ScopeReadOrganizations)
		}
		return msg + ". Add " + plural(len(se.missing), "it", "them") + " to the token in Buildkite (Personal Settings > API Access Tokens)", true
	case errors.As(err, &fe):
		return fe.msg, true
	case errors.As(err, &rl):
		return fmt.Sprintf("Buildkite's REST API rate limit of the organization is spent (%v): the queue is read again once the window resets", rl), false
	case errors.As(err, &st):
		switch st.status {
		case http.StatusUnauthorized:
			return fmt.Sprintf("Buildkite rejected the API token of --buildkite-api-token-file (%v): it is not a valid API access token, or it was revoked or has expired. Give one with the %s %s and access to %s",
				st, needs, plural(len(cfg.scopes()), "scope", "scopes"), org), true
		case http.StatusForbidden:
			return fmt.Sprintf("Buildkite refused the API token (%v): it needs the %s %s and access to %s (the token's Organization Access; the organization may also allow API access only from some IP addresses)",
				st, needs, plural(len(cfg.scopes()), "scope", "scopes"), org), true
		case http.StatusNotFound:
			if cfg.Organization == "" {
				return fmt.Sprintf("Buildkite no longer shows the organization the API token reached (%v): grant the token access to %s again, or give --buildkite-organization", st, org), true
			}
			return fmt.Sprintf("Buildkite has no organization %q that the API token reaches (%v): correct --buildkite-organization (the slug in https://buildkite.com/organizations/<slug>), or grant the token access to it", cfg.Organization, st), true
		}
		return fmt.Sprintf("Buildkite's REST API failed (%v)", st), false
	}
	return fmt.Sprintf("Buildkite's REST API at %s did not answer (%v)", preflight.BaseURL(cfg.Endpoint), err), false
}
