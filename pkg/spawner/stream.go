package spawner

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/buildkite/agent/v3/api"
	agentedgev1 "github.com/buildkite/agent/v3/api/proto/gen"
	"github.com/buildkite/agent/v3/logger"
	"github.com/go-logr/logr"
)

// The streaming ping's timings. Variables for tests.
var (
	// streamLifetime bounds one connection of the stream, which is then opened again at
	// once: a connection that died without a word (a NAT or a proxy dropping it) is noticed
	// within it. The agent's is its HTTP client's timeout, 60 s.
	streamLifetime = time.Minute
	// streamRetry is the first window a failed stream is opened again within; it doubles
	// with each failure in a row up to 64 times as long, as the agent's does.
	streamRetry = time.Second
)

// pingStream is one registration's streaming ping: a goroutine that keeps it open and
// puts what Buildkite says into box for the slot.
type pingStream struct {
	box    *streamBox
	cancel context.CancelFunc
	done   chan struct{}
}

// openStream starts the streaming ping of the slot's registration, unless it runs.
func (sl *slot) openStream() *pingStream {
	if sl.stream != nil {
		return sl.stream
	}
	ctx, cancel := context.WithCancel(context.Background())
	ps := &pingStream{box: newStreamBox(), cancel: cancel, done: make(chan struct{})}
	c := &streamConn{
		api: api.NewClient(logger.Discard, api.Config{
			Endpoint:   sl.client().Endpoint(),
			UserAgent:  sl.s.cfg.UserAgent,
			HTTPClient: &http.Client{Transport: agentTransport{base: sl.s.streamTransport, token: sl.state.AccessToken, userAgent: sl.s.cfg.UserAgent}},
		}),
		agentID: sl.state.AgentID,
		mode:    sl.s.cfg.PingMode,
		box:     ps.box,
		log:     sl.log.WithValues("agent", sl.state.AgentID),
		seen:    func() { sl.s.health.tried(sl.index, true) },
		refused: sl.s.logStreamRefused,
	}
	go func() {
		defer close(ps.done)
		c.run(ctx)
	}()
	sl.stream = ps
	return ps
}

// stopStream ends the slot's streaming ping, if it runs, and waits for it.
func (sl *slot) stopStream() {
	if sl.stream == nil {
		return
	}
	sl.stream.cancel()
	<-sl.stream.done
	sl.stream = nil
}

// logStreamRefused says once per spawner, rather than once per slot, that Buildkite does
// not offer the streaming ping.
func (s *Spawner) logStreamRefused(err error) {
	if s.streamRefusedLogged.CompareAndSwap(false, true) {
		s.log.Info("Buildkite does not offer the streaming ping at this endpoint: the slots poll for jobs", "endpoint", s.cfg.Endpoint, "error", err.Error())
	}
}

// streamConn keeps one registration's streaming ping open.
type streamConn struct {
	api     *api.Client // kept across connections for the request headers Buildkite sets
	agentID string
	mode    string
	box     *streamBox
	log     logr.Logger
	seen    func()          // Buildkite answered
	refused func(err error) // Buildkite does not offer the stream (auto)
}

// run opens the stream, and opens it again whenever it ends, until ctx ends or the stream
// can no longer help: the registration was refused, or (auto) Buildkite does not offer it.
// A stream that ends after it said something is opened again within streamRetry; one that
// fails is opened again within a window that doubles with each failure in a row, jittered
// so that slots do not reconnect in step.
func (c *streamConn) run(ctx context.Context) {
	failures := 0
	for first := true; ; first = false {
		if !first {
			window := streamRetry << min(failures, 6)
			if !sleep(ctx, rand.N(window)) {
				return
			}
		}
		spoke, err := c.once(ctx)
		if ctx.Err() != nil {
			return
		}
		if spoke {
			failures = 0
		}
		switch code := connect.CodeOf(err); {
		case err == nil, code == connect.CodeDeadlineExceeded:
			// Ended by Buildkite, by its lifetime, or to take new request headers: routine.
		case code == connect.CodeUnauthenticated:
			c.log.Info("Buildkite refused the registration on its streaming ping (401)", "error", err.Error())
			c.box.setHealth(streamRevoked)
			return
		case code == connect.CodeUnimplemented || code == connect.CodePermissionDenied:
			c.box.setHealth(streamRefused)
			if c.mode != PingModeStreamOnly {
				c.refused(err)
				return
			}
			c.log.Error(err, "Buildkite does not offer the streaming ping, and --ping-mode is stream-only: the slot takes no jobs; "+
				"use --ping-mode auto (or ping-only) to poll instead. Trying again later")
			failures = 6
		default:
			c.log.V(1).Info("the streaming ping failed; opening it again", "error", err.Error(), "failures", failures+1)
			if c.box.setHealth(streamDown) && c.mode != PingModeStreamOnly {
				c.log.V(1).Info("the slot polls until its streaming ping is back")
			}
			failures++
		}
	}
}

// once makes one connection of the stream and hands what it says to the box until it ends.
// spoke: it said something.
func (c *streamConn) once(ctx context.Context) (spoke bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, streamLifetime)
	defer cancel()
	msgs, err := c.api.StreamPings(cctx, c.agentID)
	if err != nil {
		return false, fmt.Errorf("opening the streaming ping: %w", err)
	}
	for msg, err := range msgs {
		if err != nil {
			if cctx.Err() != nil && ctx.Err() == nil {
				return spoke, nil // its lifetime is over
			}
			return spoke, fmt.Errorf("streaming ping: %w", err)
		}
		if err := c.handle(msg); err != nil {
			return spoke, err
		}
		spoke = true
		if msg.GetDisconnect() != nil {
			// The slot lets the registration go, which stops this stream; opening it
			// again meanwhile would only be refused.
			<-ctx.Done()
			return spoke, nil
		}
	}
	return spoke, nil
}

// errBrokenStream is a message no working stream sends.
var errBrokenStream = errors.New("the streaming ping sent a job without an id")

// handle puts one message into the box.
func (c *streamConn) handle(msg *agentedgev1.StreamPingsResponse) error {
	switch {
	case msg.GetJobAssigned() != nil:
		id := msg.GetJobAssigned().GetJob().GetId()
		if id == "" {
			c.box.setHealth(streamDown)
			return errBrokenStream
		}
		c.box.putJob(id)
	case msg.GetPause() != nil:
		c.box.putAction(streamPause, msg.GetPause().GetReason())
	case msg.GetDisconnect() != nil:
		c.box.putAction(streamDisconnect, msg.GetDisconnect().GetReason())
	case msg.GetResume() != nil:
		c.box.putAction(streamResume, "")
	}
	// Anything else (request headers alone, an action of a later protocol) still says
	// the stream works.
	c.seen()
	if c.box.setHealth(streamUp) {
		c.log.V(1).Info("the slot takes its jobs over Buildkite's streaming ping")
	}
	return nil
}

// agentTransport authenticates the stream's requests with the registration's token, as
// the agent API wants ("Authorization: Token <access token>"), and names the operator in
// them as in its other calls: api.Client's own User-Agent does not reach a ConnectRPC
// request, which would go as "grpc-go-connect/<version>".
type agentTransport struct {
	base             http.RoundTripper
	token, userAgent string
}

func (t agentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Token "+t.token)
	req.Header.Set("User-Agent", t.userAgent)
	return t.base.RoundTrip(req)
}

// newStreamTransport carries every slot's streaming ping: over HTTP/2, where Buildkite
// speaks it, one connection carries them all; over HTTP/1.1 each stream holds one.
func newStreamTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}
