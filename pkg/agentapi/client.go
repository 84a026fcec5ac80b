// Package agentapi is the operator's client of the Buildkite agent API: the calls an agent
// makes (register, ping, heartbeat, accept) and those a job makes with its job token (start,
// log chunks, job state, annotations, finish).
//
// Requests are made by github.com/buildkite/agent/v3/api, the client the real agent uses, over
// an HTTP client from github.com/hashicorp/go-retryablehttp set up with the agent's retry rules
// for each call (the policies in retry.go): which failures are retried, how often and how far
// apart. The api package does not retry by itself.
package agentapi

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/buildkite/agent/v3/logger"
	"github.com/hashicorp/go-retryablehttp"
)

// DefaultEndpoint is Buildkite's agent API.
const DefaultEndpoint = "https://agent.buildkite.com/v3"

// sharedTransport carries the requests of every client whose Config names no Transport.
// http.DefaultTransport keeps 2 idle connections per host, so a thousand slots calling
// one endpoint over HTTP/1.1 opened and closed a connection for nearly every call, each
// with its buffers and goroutines (Buildkite's own endpoint speaks HTTP/2, where one
// connection carries them all).
var sharedTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}()

// Config says where the API is and who is calling.
type Config struct {
	// Endpoint is the API base URL, such as https://agent.buildkite.com/v3.
	Endpoint string
	// Token is a registration token (for Register), an agent access token, or a job token.
	Token string
	// UserAgent names the caller, such as "buildkite-operator/0.1.0".
	UserAgent string
	// Transport carries the requests; when nil, one transport shared by every such client
	// (sharedTransport).
	Transport http.RoundTripper
	// Timeout bounds each HTTP attempt; 60 s when zero, as in the agent.
	Timeout time.Duration
	// WaitScale multiplies every wait between retries; tests make it small. 1 when zero.
	WaitScale float64
	// Logf, when set, is told about each retry. It never sees a token.
	Logf func(format string, args ...any)
}

// Client calls the agent API with one token. It is safe for concurrent use.
//
// The HTTP clients that make the calls (one per call, for its retry rules) are shared by
// every Client derived from one New by WithToken and WithEndpoint: each request carries its
// token in its context, and the shared transport adds it. So a client per agent
// registration or per job costs a few words, not a dozen HTTP clients.
type Client struct {
	conf  Config
	calls *calls
	// ping is the api.Client of this client's pings, kept from one ping to the next for
	// the request headers Buildkite may ask for in a ping's answer; the other calls make
	// theirs as they go.
	pingOnce sync.Once
	ping     *api.Client
}

// calls are the HTTP clients of the calls, one per retry policy, shared by the clients
// derived from one New.
type calls struct {
	http map[Call]*http.Client
	// chunks sends log chunks, which are not made by api.Client (chunks.go).
	chunks *retryablehttp.Client
}

// New returns a client for conf.
func New(conf Config) *Client {
	if conf.Endpoint == "" {
		conf.Endpoint = DefaultEndpoint
	}
	if conf.UserAgent == "" {
		conf.UserAgent = "buildkite-operator"
	}
	if conf.Timeout == 0 {
		conf.Timeout = 60 * time.Second
	}
	if conf.WaitScale == 0 {
		conf.WaitScale = 1
	}
	if conf.Transport == nil {
		conf.Transport = sharedTransport
	}
	cs := &calls{http: make(map[Call]*http.Client, len(policies))}
	for call, p := range policies {
		rc := newRetryClient(conf, call, p)
		if call == CallChunk {
			cs.chunks = rc
			continue
		}
		cs.http[call] = rc.StandardClient()
	}
	return &Client{conf: conf, calls: cs}
}

// derive returns a client like c with conf, sharing c's HTTP clients.
func (c *Client) derive(conf Config) *Client {
	return &Client{conf: conf, calls: c.calls}
}

// WithToken returns a client like c that authenticates with token: the access token after
// Register, or a job token for a job's own calls.
func (c *Client) WithToken(token string) *Client {
	conf := c.conf
	conf.Token = token
	return c.derive(conf)
}

// WithEndpoint returns a client like c that talks to endpoint; Buildkite may move an agent
// to another endpoint at register or ping. An empty endpoint changes nothing.
func (c *Client) WithEndpoint(endpoint string) *Client {
	if endpoint == "" || endpoint == c.conf.Endpoint {
		return c
	}
	conf := c.conf
	conf.Endpoint = endpoint
	return c.derive(conf)
}

// api returns the api.Client that makes call, and ctx carrying the client's token to the
// transport.
func (c *Client) api(ctx context.Context, call Call) (context.Context, *api.Client) {
	ctx = withToken(ctx, c.conf.Token)
	if call == CallPing {
		c.pingOnce.Do(func() { c.ping = c.newAPI(call) })
		return ctx, c.ping
	}
	return ctx, c.newAPI(call)
}

func (c *Client) newAPI(call Call) *api.Client {
	return api.NewClient(quiet{}, api.Config{
		Endpoint:   c.conf.Endpoint,
		UserAgent:  c.conf.UserAgent,
		HTTPClient: c.calls.http[call],
	})
}

// Endpoint is the API base URL the client talks to.
func (c *Client) Endpoint() string { return c.conf.Endpoint }

// Register registers an agent with the registration token the client holds.
func (c *Client) Register(ctx context.Context, req *api.AgentRegisterRequest) (*api.AgentRegisterResponse, error) {
	ctx, bk := c.api(ctx, CallRegister)
	reg, _, err := bk.Register(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("registering agent %q: %w", req.Name, err)
	}
	return reg, nil
}

// Connect marks the agent connected.
func (c *Client) Connect(ctx context.Context) error {
	ctx, bk := c.api(ctx, CallConnect)
	_, err := bk.Connect(ctx)
	return wrap(err, "connecting agent")
}

// Ping asks Buildkite for work. It is not retried: the caller pings again on its next tick.
func (c *Client) Ping(ctx context.Context) (*api.Ping, error) {
	ctx, bk := c.api(ctx, CallPing)
	p, _, err := bk.Ping(ctx)
	if err != nil {
		// Buildkite may send a disconnect action with an error status; the agent
		// reads the action before the error, and so do we.
		if p != nil && p.Action != "" {
			return p, nil
		}
		return nil, fmt.Errorf("pinging: %w", err)
	}
	return p, nil
}

// Heartbeat tells Buildkite the agent is alive.
func (c *Client) Heartbeat(ctx context.Context) error {
	ctx, bk := c.api(ctx, CallHeartbeat)
	_, _, err := bk.Heartbeat(ctx)
	return wrap(err, "sending heartbeat")
}

// Accept takes the job a ping offered. A 422 means another agent took it, or it was
// canceled: ping again.
func (c *Client) Accept(ctx context.Context, jobID string) (*api.Job, error) {
	ctx, bk := c.api(ctx, CallAccept)
	job, _, err := bk.AcceptJob(ctx, jobID)
	if err != nil {
		return nil, fmt.Errorf("accepting job %s: %w", jobID, err)
	}
	return job, nil
}

// Start marks the job started (a job-token call).
func (c *Client) Start(ctx context.Context, jobID string, at time.Time) error {
	ctx, bk := c.api(ctx, CallStart)
	_, err := bk.StartJob(ctx, &api.Job{ID: jobID, StartedAt: at.UTC().Format(time.RFC3339Nano)})
	return wrap(err, "starting job "+jobID)
}

// JobState reads the job's state, such as running, canceling or timing_out. It is polled,
// so it is not retried.
func (c *Client) JobState(ctx context.Context, jobID string) (JobState, error) {
	ctx, bk := c.api(ctx, CallJobState)
	s, _, err := bk.GetJobState(ctx, jobID)
	if err != nil {
		return "", fmt.Errorf("reading state of job %s: %w", jobID, err)
	}
	return JobState(s.State), nil
}

// Finish is the job's result, as Finish sends it.
type Finish struct {
	// ExitStatus of the command; -1 when it never ran or was killed.
	ExitStatus int
	// Signal that ended it, such as SIGTERM; empty when it exited.
	Signal string
	// SignalReason: one of the SignalReason constants.
	SignalReason string
	// ChunksFailedCount counts log chunks Buildkite refused.
	ChunksFailedCount int
	// FinishedAt is when the job ended; now when zero.
	FinishedAt time.Time
}

// Finish reports the job's result. A 422 (or a 401 with a job token) means the job was
// already finished or canceled; IsAlreadyFinished tells.
func (c *Client) Finish(ctx context.Context, jobID string, f Finish) error {
	if f.FinishedAt.IsZero() {
		f.FinishedAt = time.Now()
	}
	ctx, bk := c.api(ctx, CallFinish)
	_, err := bk.FinishJob(ctx, &api.Job{
		ID:                jobID,
		ExitStatus:        fmt.Sprint(f.ExitStatus),
		Signal:            f.Signal,
		SignalReason:      f.SignalReason,
		ChunksFailedCount: f.ChunksFailedCount,
		FinishedAt:        f.FinishedAt.UTC().Format(time.RFC3339Nano),
	}, nil)
	return wrap(err, "finishing job "+jobID)
}

// Annotation scopes: where Buildkite shows an annotation. A job-scoped annotation shows
// on its job; a build-scoped one at the top of the build.
const (
	ScopeBuild = "build"
	ScopeJob   = "job"
)

// Annotation is what Annotate writes.
type Annotation struct {
	// Context names the annotation: writing one with the same context (and scope)
	// replaces it, and RemoveAnnotation removes it by context.
	Context string
	// Style is one of success, info, warning, error; empty for the default.
	Style string
	// Body is the text, in Markdown.
	Body string
	// Scope is ScopeBuild (when empty) or ScopeJob.
	Scope string
}

// Annotate writes an annotation as the job (a job-token call), replacing the one of the
// same context and scope.
func (c *Client) Annotate(ctx context.Context, jobID string, a Annotation) error {
	ctx, bk := c.api(ctx, CallAnnotate)
	_, err := bk.Annotate(ctx, jobID, &api.Annotation{
		Context: a.Context, Style: a.Style, Body: a.Body, Scope: a.Scope,
	})
	return wrap(err, fmt.Sprintf("annotating job %s (context %q)", jobID, a.Context))
}

// RemoveAnnotation removes the job's annotation of context in scope (a job-token call).
// A 404 means there is none.
func (c *Client) RemoveAnnotation(ctx context.Context, jobID, context, scope string) error {
	ctx, bk := c.api(ctx, CallAnnotate)
	_, err := bk.AnnotationRemove(ctx, jobID, context, scope)
	return wrap(err, fmt.Sprintf("removing annotation %q of job %s", context, jobID))
}

// Stop tells Buildkite the agent is stopping, before Disconnect.
func (c *Client) Stop(ctx context.Context, force bool) error {
	ctx, bk := c.api(ctx, CallStop)
	_, err := bk.Stop(ctx, &api.AgentStopRequest{Force: force})
	return wrap(err, "stopping agent")
}

// Disconnect unregisters the agent.
func (c *Client) Disconnect(ctx context.Context) error {
	ctx, bk := c.api(ctx, CallDisconnect)
	_, err := bk.Disconnect(ctx)
	return wrap(err, "disconnecting agent")
}

func wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// quiet is the logger of the api package's clients: it says nothing and costs nothing.
// logger.Discard writes nowhere but is at the DEBUG level, so each request formatted two
// debug lines for nothing, each reading and parsing the binary's build information
// (version.FullVersion): at 1000 slots, a quarter of all the operator allocated.
type quiet struct{}

var _ logger.Logger = quiet{}

func (quiet) Debugf(string, ...any)                      {}
func (quiet) Errorf(string, ...any)                      {}
func (quiet) Fatalf(string, ...any)                      {}
func (quiet) Noticef(string, ...any)                     {}
func (quiet) Warnf(string, ...any)                       {}
func (quiet) Infof(string, ...any)                       {}
func (q quiet) WithFields(...logger.Field) logger.Logger { return q }
func (quiet) SetLevel(logger.Level)                      {}
func (quiet) Level() logger.Level                        { return logger.FATAL }
