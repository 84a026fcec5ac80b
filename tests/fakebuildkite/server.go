// Package fakebuildkite is an in-process fake of the Buildkite agent API (v3) and of just enough of
// Buildkite itself (builds made from pipeline YAML, job dispatch by agent tags, cancellation,
// timeouts) to run the operator, its tests and the real buildkite-agent against it.
//
// It is checked against the real buildkite-agent binary in this package's tests, so that tests
// built on it exercise the protocol as Buildkite speaks it: three kinds of token, job states,
// gzip log chunks reassembled by offset, finish exactly once, and the status codes the agent's
// retry rules depend on. It serves Buildkite's streaming ping (agentedge.v1.AgentEdgeService,
// with the handler generated in the agent's module) unless Options.NoStreaming, pushing each
// job to a streaming agent the moment it is dispatched, and records how each job was offered
// and accepted (JobSnapshot.OfferedVia, AcceptedVia). Faults (latency, 5xx, 429 with
// Retry-After, dropped connections, cut streams, revoked agents) can be injected per endpoint.
package fakebuildkite

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a fake. The zero value is usable: every field has a default.
type Options struct {
	// RegistrationToken is the only token register accepts. Default "fake-registration-token".
	RegistrationToken string
	// PingInterval, HeartbeatInterval and JobStatusInterval are the seconds sent to agents at
	// register. Defaults 1, 5 and 1: short, so that tests with a real agent are quick.
	PingInterval, HeartbeatInterval, JobStatusInterval int
	// ChunksMaxSizeBytes is sent in every accepted Job; the agent refuses to stream logs when it
	// is 0. Default 102400.
	ChunksMaxSizeBytes int64
	// ChunksIntervalSeconds is sent in every accepted Job. Default 1.
	ChunksIntervalSeconds int
	// LogMaxSizeBytes is sent in every accepted Job. Default 1 GiB, as Buildkite does.
	LogMaxSizeBytes int64
	// MinuteDuration is how long "a minute" of timeout_in_minutes lasts, so that tests can time
	// jobs out quickly. Default time.Minute.
	MinuteDuration time.Duration
	// NoStreaming turns the streaming ping off: the fake then answers it as Buildkite does
	// where it does not offer it (unimplemented), and agents poll. By default it is served
	// (pingstream.go) and jobs are pushed to streaming agents the moment they are dispatched.
	NoStreaming bool
	// AgentLostAfter is how long a connected agent may stay silent (no ping, no heartbeat,
	// no open streaming ping) before it is reported as lost. Default 3 heartbeat intervals.
	AgentLostAfter time.Duration
	// Addr is the listen address for Start. Default "127.0.0.1:0".
	Addr string
	// Logf, when set, receives one line per notable event. Tokens are never logged.
	Logf func(format string, args ...any)
}

func (o *Options) setDefaults() {
	if o.RegistrationToken == "" {
		o.RegistrationToken = "fake-registration-token"
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 1
	}
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = 5
	}
	if o.JobStatusInterval <= 0 {
		o.JobStatusInterval = 1
	}
	if o.ChunksMaxSizeBytes <= 0 {
		o.ChunksMaxSizeBytes = 102400
	}
	if o.ChunksIntervalSeconds <= 0 {
		o.ChunksIntervalSeconds = 1
	}
	if o.LogMaxSizeBytes <= 0 {
		o.LogMaxSizeBytes = 1 << 30
	}
	if o.MinuteDuration <= 0 {
		o.MinuteDuration = time.Minute
	}
	if o.AgentLostAfter <= 0 {
		o.AgentLostAfter = 3 * time.Duration(o.HeartbeatInterval) * time.Second
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
}

// Server is a running fake. All its methods are safe for concurrent use.
type Server struct {
	opts    Options
	handler http.Handler

	listener net.Listener
	httpSrv  *http.Server
	baseURL  string

	mu sync.Mutex
	// changed is closed and replaced on every state change, to wake WaitJob callers.
	changed chan struct{}
	closed  bool
	// stopped mirrors closed without the lock, so that nothing logs after Close (a test's
	// Logf must not be called once the test has ended).
	stopped atomic.Bool
	// done is closed by Close: open streaming pings end.
	done chan struct{}

	// rest is the REST API's state (restapi.go), which the preflight reads.
	rest *RESTAPI

	agents      map[string]*agent // by id
	agentOrder  []string
	accessToken map[string]string // access token -> agent id
	jobToken    map[string]string // job token -> job id

	builds     map[string]*build
	buildOrder []string
	buildNums  map[string]int // "org/pipeline" -> last number

	jobs     map[string]*job
	jobOrder []string
	// firstLive is where pushJobsLocked starts in jobOrder: every job before it is over.
	firstLive int

	// streams are the open streaming pings, by agent id: one per agent.
	streams map[string]*agentStream

	artifacts     map[string]*artifact
	artifactOrder []string
	batches       map[string][]string // artifact batch id -> artifact ids

	faults   []*faultState
	requests []Request

	secrets      map[string]map[string]secret // by secretsKey, then upper-case key
	oidcRequests []OIDCTokenRequest
	oidcKey      []byte // signs OIDC tokens; made once, on first use
	oidcKeyOnce  sync.Once

	timers []*time.Timer
}

// Start listens on opts.Addr and serves the fake until Close.
func Start(opts Options) (*Server, error) {
	s := newServer(opts)
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("fake buildkite: listen on %q: %w", s.opts.Addr, err)
	}
	s.listener = ln
	s.baseURL = "http://" + ln.Addr().String()
	s.httpSrv = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logf("fake buildkite: serve: %v", err)
		}
	}()
	return s, nil
}

// NewUnstarted returns a fake that does not listen; serve Handler yourself and tell it the base
// URL it is reachable at with SetBaseURL (the URL goes into job env and artifact instructions).
func NewUnstarted(opts Options) *Server {
	return newServer(opts)
}

func newServer(opts Options) *Server {
	opts.setDefaults()
	s := &Server{
		opts:        opts,
		changed:     make(chan struct{}),
		done:        make(chan struct{}),
		streams:     map[string]*agentStream{},
		rest:        newRESTAPI(),
		agents:      map[string]*agent{},
		accessToken: map[string]string{},
		jobToken:    map[string]string{},
		builds:      map[string]*build{},
		buildNums:   map[string]int{},
		jobs:        map[string]*job{},
		artifacts:   map[string]*artifact{},
		batches:     map[string][]string{},
	}
	s.handler = s.routes()
	return s
}

// SetBaseURL sets the base URL of a fake made with NewUnstarted, e.g. "http://127.0.0.1:8080".
func (s *Server) SetBaseURL(u string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.baseURL = strings.TrimSuffix(u, "/")
}

// URL is the base URL: the web page is at "/", the control API under "/control/".
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.baseURL
}

// Endpoint is what agents use as BUILDKITE_AGENT_ENDPOINT / --endpoint.
func (s *Server) Endpoint() string { return s.URL() + "/v3" }

// RegistrationToken is the token agents register with.
func (s *Server) RegistrationToken() string { return s.opts.RegistrationToken }

// Handler serves the agent API, the control API and the web page.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops serving and stops the timeout timers. Waiters in WaitJob are released.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.stopped.Store(true)
	close(s.done)
	for _, t := range s.timers {
		t.Stop()
	}
	s.notifyLocked()
	s.mu.Unlock()
	if s.httpSrv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.httpSrv.Shutdown(ctx); err != nil {
		// Long polls or hijacked connections may linger; closing is what matters for a fake.
		_ = s.httpSrv.Close()
	}
	return nil
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil && !s.stopped.Load() {
		s.opts.Logf(format, args...)
	}
}

// notifyLocked wakes everyone waiting for a change, and pushes waiting jobs to the agents
// whose streaming ping can take one. Call with s.mu held.
func (s *Server) notifyLocked() {
	s.pushJobsLocked()
	close(s.changed)
	s.changed = make(chan struct{})
}

func newToken(prefix string) string {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return prefix + hex.EncodeToString(b)
}

func newUUID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// writeJSON writes v with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes Buildkite's error shape: {"message": "..."}.
func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"message": fmt.Sprintf(format, args...)})
}

// decodeJSON reads a JSON body strictly enough to catch client bugs (a number where Buildkite
// expects a string) but ignores unknown fields, as Rails does.
func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<20))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	return nil
}
