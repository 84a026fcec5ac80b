package preflight

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/buildkite/go-buildkite/v4"
)

// The REST API plumbing the start-up check shares with the other readers of Buildkite's
// REST API (pkg/warmdemand): the client, the paging, and the errors of a call.

// MaxPageSize is the REST API's largest page.
const MaxPageSize = 100

// lookupPages bounds a listing of the lookups: 2000 organizations, clusters or queues at
// the largest page.
const lookupPages = 20

// NewClient is a go-buildkite client of the REST API at endpoint (DefaultEndpoint when
// empty) with token, which makes its requests with hc and sends userAgent, when not empty,
// with each.
func NewClient(endpoint, token, userAgent string, hc *http.Client) (*buildkite.Client, error) {
	opts := []buildkite.ClientOpt{
		buildkite.WithBaseURL(BaseURL(endpoint)),
		buildkite.WithTokenAuth(token),
		buildkite.WithHTTPClient(hc),
	}
	if userAgent != "" {
		opts = append(opts, buildkite.WithUserAgent(userAgent))
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

// Paginate calls page with the options of each page of a listing, from the first, until
// the last page or maxPages of them: every call spends the organization's REST API rate
// limit, so a caller bounds them. pageSize is MaxPageSize when 0. more is true when it
// stopped with pages left.
func Paginate(ctx context.Context, pageSize, maxPages int, page func(buildkite.ListOptions) (*buildkite.Response, error)) (more bool, err error) {
	if pageSize <= 0 {
		pageSize = MaxPageSize
	}
	opt := buildkite.ListOptions{Page: 1, PerPage: pageSize}
	for range maxPages {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		resp, err := page(opt)
		if err != nil {
			return false, err
		}
		// A page that names itself as the next would be read forever.
		if resp == nil || resp.NextPage == 0 || resp.NextPage == opt.Page {
			return false, nil
		}
		opt.Page = resp.NextPage
	}
	return true, nil
}

// listAll is every item of a listing, up to lookupPages of them.
func listAll[T any](ctx context.Context, pageSize int, list func(buildkite.ListOptions) ([]T, *buildkite.Response, error)) ([]T, error) {
	var all []T
	_, err := Paginate(ctx, pageSize, lookupPages, func(o buildkite.ListOptions) (*buildkite.Response, error) {
		items, resp, err := list(o)
		all = append(all, items...)
		return resp, err
	})
	return all, err
}

// CallError is the *APIError of a call that failed: what Buildkite answered (status and
// message), or why it did not answer.
func CallError(call string, err error) error {
	var er *buildkite.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		return &APIError{Call: call, Status: er.Response.StatusCode, Message: er.Message}
	}
	return &APIError{Call: call, Err: err}
}

// StatusOf is the HTTP status Buildkite answered a failed call with; 0 when it did not
// answer.
func StatusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// ReadAPIToken reads a Buildkite API token from its file (a mounted Secret), without the
// whitespace around it; an empty file is an error. Callers say which flag named the file.
func ReadAPIToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return token, nil
}
