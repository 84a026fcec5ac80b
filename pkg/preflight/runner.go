package preflight

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/buildkite/go-buildkite/v4"
	"github.com/hashicorp/go-retryablehttp"
)

// DefaultEndpoint is Buildkite's REST API (go-buildkite's default base URL).
const DefaultEndpoint = buildkite.DefaultBaseURL

// DefaultTimeout bounds a whole run, retries included: the check is a start-up courtesy,
// and a REST API that does not answer must not keep it, or its goroutine, waiting.
const DefaultTimeout = 30 * time.Second

const (
	// defaultPageSize is the REST API's largest page.
	defaultPageSize = 100
	// maxPages bounds a listing: 2000 clusters or queues at the largest page.
	maxPages = 20
	// attemptTimeout bounds one request; attempts are retried within DefaultTimeout.
	attemptTimeout = 10 * time.Second
)

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
	// pageSize is the page size of listings (tests shorten it); defaultPageSize when 0.
	pageSize int
}

// Run asks the REST API and evaluates its answers.
func (r *Runner) Run(ctx context.Context, cfg Config) []Finding {
	return Evaluate(cfg, r.Ask(ctx, cfg))
}

// Ask makes the calls Evaluate needs, in order, and stops at the first answer that stops
// the checks (Evaluate then reports it): the same decisions Evaluate makes, from the same
// functions.
func (r *Runner) Ask(ctx context.Context, cfg Config) Answers {
	a := Answers{Endpoint: endpointSlash(r.Endpoint)}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bk, err := r.client()
	if err != nil {
		a.TokenErr = &APIError{Call: "the client", Err: err}
		return a
	}

	tok, _, err := bk.AccessTokens.Get(ctx)
	if err != nil {
		a.TokenErr = apiError("GET v2/access-token", err)
		return a
	}
	a.Token = Token{Scopes: tok.Scopes}
	if _, stop := checkToken(cfg, a); stop {
		return a
	}

	if cfg.Organization == "" {
		orgs, err := listAll(ctx, r.pageSize, func(o buildkite.ListOptions) ([]buildkite.Organization, *buildkite.Response, error) {
			return bk.Organizations.List(ctx, &buildkite.OrganizationListOptions{ListOptions: o})
		})
		if err != nil {
			a.OrganizationsErr = apiError("GET v2/organizations", err)
			return a
		}
		for _, o := range orgs {
			a.Organizations = append(a.Organizations, Organization{Slug: o.Slug, Name: o.Name})
		}
	}
	org, _, ok := resolveOrganization(cfg, a)
	if !ok {
		return a
	}

	clusters, err := listAll(ctx, r.pageSize, func(o buildkite.ListOptions) ([]buildkite.Cluster, *buildkite.Response, error) {
		return bk.Clusters.List(ctx, org, &buildkite.ClustersListOptions{ListOptions: o})
	})
	if err != nil {
		a.ClustersErr = apiError("GET v2/organizations/"+org+"/clusters", err)
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
		qs, err := listAll(ctx, r.pageSize, func(o buildkite.ListOptions) ([]buildkite.ClusterQueue, *buildkite.Response, error) {
			return bk.ClusterQueues.List(ctx, org, c.ID, &buildkite.ClusterQueuesListOptions{ListOptions: o})
		})
		if err != nil {
			a.QueuesErr[c.ID] = apiError("GET v2/organizations/"+org+"/clusters/"+c.ID+"/queues", err)
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
	opts := []buildkite.ClientOpt{
		buildkite.WithBaseURL(BaseURL(r.Endpoint)),
		buildkite.WithTokenAuth(r.Token),
		buildkite.WithHTTPClient(hc),
	}
	if r.UserAgent != "" {
		opts = append(opts, buildkite.WithUserAgent(r.UserAgent))
	}
	bk, err := buildkite.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("making the Buildkite REST API client: %w", err)
	}
	return bk, nil
}

// BaseURL is what go-buildkite takes for endpoint: with a trailing slash, and without a
// trailing /v2, which go-buildkite adds to every path (a URL copied from Buildkite's
// documentation has it).
func BaseURL(endpoint string) string {
	if endpoint == "" {
		return DefaultEndpoint
	}
	e := strings.TrimSuffix(endpoint, "/")
	e = strings.TrimSuffix(e, "/v2")
	return e + "/"
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

// listAll follows a listing's pages, up to maxPages.
func listAll[T any](ctx context.Context, pageSize int, list func(buildkite.ListOptions) ([]T, *buildkite.Response, error)) ([]T, error) {
	if pageSize <= 0 {
		pageSize = defaultPageSize
	}
	var all []T
	opt := buildkite.ListOptions{Page: 1, PerPage: pageSize}
	for range maxPages {
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

// apiError keeps what Buildkite answered (status and message), or why it did not answer.
func apiError(call string, err error) error {
	var er *buildkite.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		return &APIError{Call: call, Status: er.Response.StatusCode, Message: er.Message}
	}
	return &APIError{Call: call, Err: err}
}
