package preflight

import (
	"context"
	"net/http"
	"time"

	"github.com/buildkite/go-buildkite/v4"
	"github.com/hashicorp/go-retryablehttp"
)

// DefaultEndpoint is Buildkite's REST API (go-buildkite's default base URL).
const DefaultEndpoint = buildkite.DefaultBaseURL

// DefaultTimeout bounds a whole run, retries included: the check is a start-up courtesy,
// and a REST API that does not answer must not keep it, or its goroutine, waiting.
const DefaultTimeout = 30 * time.Second

// attemptTimeout bounds one request; attempts are retried within DefaultTimeout.
const attemptTimeout = 10 * time.Second

// Runner asks Buildkite's REST API what the checks need, with go-buildkite, and evaluates
// the answers.
type Runner struct {
	// Endpoint is the REST API's base URL; DefaultEndpoint when empty.
	Endpoint string
	// Token is the API access token. It is sent to Endpoint only, and never logged.
	Token string
	// UserAgent is sent with every request; go-buildkite's when empty.
	UserAgent string
	// Timeout bounds the whole run; DefaultTimeout when 0.
	Timeout time.Duration
	// HTTPClient makes the requests; when nil, one that retries a failed connection, a
	// 429 and a 5xx a few times (go-retryablehttp: go-buildkite itself retries only a
	// 429).
	HTTPClient *http.Client

	// retryWait is the first wait between attempts (tests shorten it); 1 s when 0.
	retryWait time.Duration
	// pageSize is the page size of listings (tests shorten it); MaxPageSize when 0.
	pageSize int
}

// Run asks the REST API and evaluates its answers.
func (r *Runner) Run(ctx context.Context, cfg Config) []Finding {
	return Evaluate(cfg, r.Ask(ctx, cfg))
}

// Ask makes the calls Evaluate needs, in order, and stops at the first answer that stops
// the checks (Evaluate then reports it).
func (r *Runner) Ask(ctx context.Context, cfg Config) Answers {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var a Answers
	if bk, err := r.client(); err != nil {
		a.TokenErr = &APIError{Call: "the client", Err: err}
	} else {
		a = ask(ctx, bk, r.pageSize, cfg, checkNeeds(cfg), true)
	}
	a.Endpoint = endpointSlash(r.Endpoint)
	return a
}

// ask makes the calls that find what cfg names, in order, and stops at the first answer
// that stops the checks: the same decisions Evaluate and Lookup make, from the same
// functions. The token must have the scopes of needs. Without cfg.Cluster, searchAll has
// every cluster's queues read (the start-up check searches them for the queue); else the
// calls end with the organization.
func ask(ctx context.Context, bk *buildkite.Client, pageSize int, cfg Config, needs []Need, searchAll bool) Answers {
	var a Answers
	tok, _, err := bk.AccessTokens.Get(ctx)
	if err != nil {
		a.TokenErr = CallError("GET v2/access-token", err)
		return a
	}
	a.Token = Token{Scopes: tok.Scopes}
	if _, stop := checkScopes(a.Token, needs); stop {
		return a
	}

	if cfg.Organization == "" {
		orgs, err := listAll(ctx, pageSize, func(o buildkite.ListOptions) ([]buildkite.Organization, *buildkite.Response, error) {
			return bk.Organizations.List(ctx, &buildkite.OrganizationListOptions{ListOptions: o})
		})
		if err != nil {
			a.OrganizationsErr = CallError("GET v2/organizations", err)
			return a
		}
		for _, o := range orgs {
			a.Organizations = append(a.Organizations, Organization{Slug: o.Slug, Name: o.Name})
		}
	}
	org, _, ok := resolveOrganization(cfg, a)
	if !ok || (cfg.Cluster == "" && !searchAll) {
		return a
	}

	clusters, err := listAll(ctx, pageSize, func(o buildkite.ListOptions) ([]buildkite.Cluster, *buildkite.Response, error) {
		return bk.Clusters.List(ctx, org, &buildkite.ClustersListOptions{ListOptions: o})
	})
	if err != nil {
		a.ClustersErr = CallError("GET v2/organizations/"+org+"/clusters", err)
		return a
	}
	for _, c := range clusters {
		a.Clusters = append(a.Clusters, Cluster{ID: c.ID, Name: c.Name, WebURL: c.WebURL})
	}
	targets, _, ok := matchClusters(cfg, org, a.Clusters)
	if !ok {
		return a
	}

	a.Queues, a.QueuesErr = map[string][]Queue{}, map[string]error{}
	for _, c := range targets {
		qs, err := listAll(ctx, pageSize, func(o buildkite.ListOptions) ([]buildkite.ClusterQueue, *buildkite.Response, error) {
			return bk.ClusterQueues.List(ctx, org, c.ID, &buildkite.ClusterQueuesListOptions{ListOptions: o})
		})
		if err != nil {
			a.QueuesErr[c.ID] = CallError("GET v2/organizations/"+org+"/clusters/"+c.ID+"/queues", err)
			continue
		}
		for _, q := range qs {
			a.Queues[c.ID] = append(a.Queues[c.ID], queueOf(q))
		}
	}
	return a
}

func queueOf(q buildkite.ClusterQueue) Queue {
	out := Queue{ID: q.ID, Key: q.Key, WebURL: q.WebURL, DispatchPaused: q.DispatchPaused, PausedNote: q.DispatchPausedNote}
	if q.DispatchPausedBy != nil {
		out.PausedBy = q.DispatchPausedBy.Name
		if out.PausedBy == "" {
			out.PausedBy = q.DispatchPausedBy.Email
		}
	}
	if q.DispatchPausedAt != nil {
		out.PausedAt = q.DispatchPausedAt.Time
	}
	return out
}

// client is a go-buildkite client of r's endpoint and token.
func (r *Runner) client() (*buildkite.Client, error) {
	hc := r.HTTPClient
	if hc == nil {
		hc = retryingClient(r.retryWait)
	}
	return NewClient(r.Endpoint, r.Token, r.UserAgent, hc)
}

// retryingClient retries what may pass: a connection that failed, a 429 (after its
// Retry-After) and a 5xx, up to 3 times, waiting wait, then twice as long, and so on. The
// last answer is handed back as it is, so that go-buildkite reports Buildkite's message.
func retryingClient(wait time.Duration) *http.Client {
	if wait <= 0 {
		wait = time.Second
	}
	rc := retryablehttp.NewClient()
	rc.Logger = nil // the caller reports what matters
	rc.RetryMax = 3
	rc.RetryWaitMin, rc.RetryWaitMax = wait, 8*wait
	rc.HTTPClient.Timeout = attemptTimeout
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	return rc.StandardClient()
}
