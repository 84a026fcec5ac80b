package agentapi

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/hashicorp/go-retryablehttp"
)

// Call names an API call that has its own retry policy.
type Call string

// The calls, each retried as the real agent retries it.
const (
	CallRegister   Call = "register"
	CallConnect    Call = "connect"
	CallPing       Call = "ping"
	CallHeartbeat  Call = "heartbeat"
	CallAccept     Call = "accept"
	CallStart      Call = "start"
	CallJobState   Call = "job_state"
	CallChunk      Call = "chunks"
	CallFinish     Call = "finish"
	CallStop       Call = "stop"
	CallDisconnect Call = "disconnect"
	CallAnnotate   Call = "annotate"
)

// Policy is how one call is retried.
type Policy struct {
	// Attempts in all, the first included.
	Attempts int
	// Wait before the second attempt; later waits grow when Exponential.
	Wait time.Duration
	// MaxWait caps one wait.
	MaxWait time.Duration
	// Exponential doubles the wait after each attempt, with jitter.
	Exponential bool
	// NetworkOnly retries only failures to reach the API, never an HTTP status.
	NetworkOnly bool
}

// policies follow the retries buildkite-agent makes around each of these calls. 429 and 5xx are
// retried, other 4xx never; a Retry-After header sets the wait when present, up to
// MaxRetryAfter. A caller that must not wait as long as a policy can retry bounds the call
// with its context's deadline.
var policies = map[Call]Policy{
	CallRegister:   {Attempts: 30, Wait: 10 * time.Second},
	CallConnect:    {Attempts: 10, Wait: 5 * time.Second},
	CallPing:       {Attempts: 1},
	CallHeartbeat:  {Attempts: 10, Wait: 5 * time.Second},
	CallAccept:     {Attempts: 30, Wait: 5 * time.Second, NetworkOnly: true},
	CallStart:      {Attempts: 7, Wait: 2 * time.Second, MaxWait: time.Minute, Exponential: true},
	CallJobState:   {Attempts: 1},
	CallChunk:      {Attempts: 12, Wait: 500 * time.Millisecond, MaxWait: 5 * time.Minute, Exponential: true},
	CallFinish:     {Attempts: 12, Wait: time.Second, MaxWait: 5 * time.Minute, Exponential: true},
	CallStop:       {Attempts: 1},
	CallDisconnect: {Attempts: 4, Wait: time.Second},
	// buildkite-agent annotate and annotation remove: 5 attempts, 1 s apart.
	CallAnnotate: {Attempts: 5, Wait: time.Second},
}

// MaxRetryAfter caps the wait a Retry-After header asks for. Buildkite sends short ones;
// a proxy or an outage page may ask for an hour, and a caller that obeyed would hold
// whatever it holds (a slot, a reconcile worker) for that hour.
const MaxRetryAfter = 60 * time.Second

// PolicyOf returns the retry policy of call.
func PolicyOf(call Call) Policy { return policies[call] }

// newRetryClient returns the client one call is made with: retries per p, then the token
// of the request's context on every request (api.Client leaves auth to the client it is
// given).
func newRetryClient(conf Config, call Call, p Policy) *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{
		Transport: tokenTransport{base: conf.Transport},
		Timeout:   conf.Timeout,
	}
	rc.Logger = nil
	rc.RetryMax = max(p.Attempts-1, 0)
	rc.CheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		retry := retryable(resp, err, p.NetworkOnly)
		if retry && conf.Logf != nil {
			conf.Logf("agent API %s failed, retrying: %s", call, describe(resp, err))
		}
		return retry, nil
	}
	rc.Backoff = func(_, _ time.Duration, attempt int, resp *http.Response) time.Duration {
		return scale(backoff(p, attempt, resp), conf.WaitScale)
	}
	// Hand the last response to api.Client, which turns a bad status into its error.
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	return rc
}

func retryable(resp *http.Response, err error, networkOnly bool) bool {
	if err != nil {
		return api.IsRetryableError(err)
	}
	if networkOnly {
		return false
	}
	return api.IsRetryableStatus(&api.Response{Response: resp})
}

func backoff(p Policy, attempt int, resp *http.Response) time.Duration {
	if resp != nil {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			// Compared in seconds first: a huge value would overflow a Duration.
			if s >= int(MaxRetryAfter/time.Second) {
				return MaxRetryAfter
			}
			return time.Duration(s) * time.Second
		}
	}
	wait := p.Wait
	if p.Exponential {
		wait = p.Wait << min(attempt, 20)
		wait += time.Duration(rand.Int64N(int64(p.Wait) + 1))
	}
	if p.MaxWait > 0 && wait > p.MaxWait {
		wait = p.MaxWait
	}
	return wait
}

func scale(d time.Duration, f float64) time.Duration {
	return time.Duration(float64(d) * f)
}

func describe(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// tokenKey is the context key of the token a request is made with.
type tokenKey struct{}

// withToken returns ctx carrying the token of the requests made with it.
func withToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

// tokenTransport authenticates every request as the agent does, "Authorization: Token
// ...", with the token its context carries (withToken): one transport serves every
// client derived from one New, each with its own token.
type tokenTransport struct {
	base http.RoundTripper
}

func (t tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, _ := req.Context().Value(tokenKey{}).(string)
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Token "+token)
	return t.base.RoundTrip(req)
}

// StatusCode is the HTTP status of a failed call, or 0 when the API was not reached.
func StatusCode(err error) int {
	var er *api.ErrorResponse
	if errors.As(err, &er) && er.Response != nil {
		return er.Response.StatusCode
	}
	return 0
}

// IsUnauthorized reports a 401: a revoked agent, or a job token that is no longer valid.
func IsUnauthorized(err error) bool { return StatusCode(err) == http.StatusUnauthorized }

// IsAlreadyFinished reports that Buildkite refused a job call because the job was already
// finished, canceled or taken by another agent (422).
func IsAlreadyFinished(err error) bool { return StatusCode(err) == http.StatusUnprocessableEntity }

// IsPermanent reports an HTTP status that retrying will not change (a 4xx other than 429).
func IsPermanent(err error) bool {
	code := StatusCode(err)
	return code >= 400 && code < 500 && code != http.StatusTooManyRequests
}
