package fakebuildkite

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	agentedgev1 "github.com/buildkite/agent/v3/api/proto/gen"
	"github.com/buildkite/agent/v3/api/proto/gen/agentedgev1connect"
)

// streamPingsPath is where agents from v3.122 on open the streaming ping (the ConnectRPC
// service agentedge.v1.AgentEdgeService, served at the root of the endpoint's host).
const streamPingsPath = agentedgev1connect.AgentEdgeServiceStreamPingsProcedure

// streamBuffer is how many messages may wait for a slow stream before the fake cuts it,
// as a server that cannot write to a connection gives up on it: the agent reconnects, and
// what it was told again on connect is all it needs.
const streamBuffer = 64

// agentStream is one open streaming ping. Its messages are queued under s.mu, in order,
// and written by the goroutine serving the stream.
type agentStream struct {
	agentID string
	out     chan *agentedgev1.StreamPingsResponse
	// end tells the serving goroutine to end the stream: with an error (a gRPC status), or
	// by dropping the connection. Buffered: the first end wins.
	end chan streamEnd
	// action is the agent action the stream last told ("" before the first message).
	action string
}

type streamEnd struct {
	drop bool
	err  error
}

// stop ends the stream, once.
func (st *agentStream) stop(e streamEnd) {
	select {
	case st.end <- e:
	default:
	}
}

// send queues msg for the agent; a stream too slow to take it is cut.
func (st *agentStream) send(msg *agentedgev1.StreamPingsResponse) {
	select {
	case st.out <- msg:
	default:
		st.stop(streamEnd{drop: true})
	}
}

// streamPingsHandler serves the streaming ping with the handler generated in the agent's
// module, or, with Options.NoStreaming, answers as Buildkite does where it does not offer it.
func (s *Server) streamPingsHandler() http.HandlerFunc {
	_, h := agentedgev1connect.NewAgentEdgeServiceHandler(edgeService{s})
	return func(w http.ResponseWriter, r *http.Request) {
		if s.opts.NoStreaming {
			s.handleStreamPingsUnoffered(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}
}

// edgeService is the fake's agentedge.v1.AgentEdgeService.
type edgeService struct{ s *Server }

var _ agentedgev1connect.AgentEdgeServiceHandler = edgeService{}

// StreamPings keeps one agent told of its actions and the jobs the fake assigns it, for as
// long as the agent stays connected: on connect its current action (and a job assigned to
// it and not yet accepted, again), then every change as it happens. A job is pushed the
// moment it is dispatched (pushJobsLocked), where a polling agent learns of it on its next
// ping.
func (e edgeService) StreamPings(ctx context.Context, req *connect.Request[agentedgev1.StreamPingsRequest], stream *connect.ServerStream[agentedgev1.StreamPingsResponse]) error {
	s := e.s
	st, err := s.openStream(req.Header(), req.Msg.GetAgentId())
	if err != nil {
		return err
	}
	defer s.closeStream(st)
	for {
		select {
		case msg := <-st.out:
			if err := stream.Send(msg); err != nil {
				return fmt.Errorf("sending to agent %s: %w", st.agentID, err)
			}
		case end := <-st.end:
			if end.drop {
				s.logf("fake buildkite: streaming ping of agent %s cut", st.agentID)
				// Ends the response without its trailers and closes the connection, as a
				// load balancer dropping it would (net/http takes this panic for that).
				panic(http.ErrAbortHandler)
			}
			return end.err
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return connect.NewError(connect.CodeUnavailable, errors.New("the fake Buildkite is shutting down"))
		}
	}
}

// openStream checks the agent's access token and the agent the stream is for, then makes
// the agent's stream, closing any it had (Buildkite keeps one per agent), and queues what
// the agent is told on connect.
func (s *Server) openStream(h http.Header, agentID string) (*agentStream, error) {
	tok, _ := strings.CutPrefix(h.Get("Authorization"), "Token ")
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.accessToken[strings.TrimSpace(tok)]
	switch {
	case !ok:
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("this call needs an agent access token (the access_token from register)"))
	case s.agents[id].revoked:
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("this agent's access token has been revoked"))
	case agentID != id:
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("agent_id %q is not the agent of this access token", agentID))
	}
	a := s.agents[id]
	if a.action == ActionStop {
		// The streaming ping has no stop action: the agent hears it from a ping, which it
		// makes only while its stream is down.
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("this agent was told to stop: ping for the action"))
	}
	if old := s.streams[id]; old != nil {
		old.stop(streamEnd{err: connect.NewError(connect.CodeAborted, errors.New("replaced by a newer stream of the same agent"))})
	}
	st := &agentStream{agentID: id, out: make(chan *agentedgev1.StreamPingsResponse, streamBuffer), end: make(chan streamEnd, 1)}
	s.streams[id] = st
	a.streamsOpened++
	a.lastStream = time.Now()
	s.logf("fake buildkite: agent %s opened a streaming ping", id)
	s.tellActionLocked(a, st)
	if j, ok := s.jobs[a.currentJob]; ok && j.state == StateAssigned && j.assignedTo == a.id {
		// Assigned before the stream (re)opened and not accepted: told again, or a job
		// pushed into a stream that was cut would wait for this agent for good.
		j.offeredVia = append(j.offeredVia, ViaStream)
		st.send(jobAssigned(j.id))
	}
	s.notifyLocked() // pushes a job to the agent if one waits
	return st, nil
}

// closeStream forgets a stream that ended.
func (s *Server) closeStream(st *agentStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streams[st.agentID] == st {
		delete(s.streams, st.agentID)
		if a, ok := s.agents[st.agentID]; ok {
			a.lastStream = time.Now()
		}
		s.logf("fake buildkite: streaming ping of agent %s closed", st.agentID)
		s.notifyLocked()
	}
}

// tellActionLocked sends the agent's action to its stream when the stream has not told it
// yet. Stop has no message in the streaming protocol: the stream ends, so that the agent
// pings and hears it there.
func (s *Server) tellActionLocked(a *agent, st *agentStream) {
	if st.action == a.action {
		return
	}
	st.action = a.action
	switch a.action {
	case ActionPause:
		st.send(&agentedgev1.StreamPingsResponse{Action: &agentedgev1.StreamPingsResponse_Pause{Pause: &agentedgev1.PauseAction{Reason: pauseMessage}}})
	case ActionDisconnect:
		st.send(&agentedgev1.StreamPingsResponse{Action: &agentedgev1.StreamPingsResponse_Disconnect{Disconnect: &agentedgev1.DisconnectAction{Reason: disconnectMessage}}})
	case ActionStop:
		st.stop(streamEnd{err: connect.NewError(connect.CodeUnavailable, errors.New("this agent was told to stop: ping for the action"))})
	default:
		st.send(&agentedgev1.StreamPingsResponse{Action: &agentedgev1.StreamPingsResponse_Resume{Resume: &agentedgev1.ResumeAction{}}})
	}
}

func jobAssigned(id string) *agentedgev1.StreamPingsResponse {
	return &agentedgev1.StreamPingsResponse{Action: &agentedgev1.StreamPingsResponse_JobAssigned{
		JobAssigned: &agentedgev1.JobAssignedAction{Job: &agentedgev1.Job{Id: id}},
	}}
}

// handleStreamPingsUnoffered answers the streaming ping as Buildkite does where it does not
// offer it: the RPC is unimplemented. The agent (`--ping-mode auto`, its default) takes that
// code as final, logs that it falls back to polling for good, and pings as older agents
// do; any other answer (a 404 page, a 405) would read as a passing outage, and the agent
// would keep retrying the stream with backoff for as long as it runs.
func (s *Server) handleStreamPingsUnoffered(w http.ResponseWriter, r *http.Request) {
	const msg = "the fake Buildkite does not offer streaming pings: poll GET /v3/ping"
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		// gRPC (what the agent speaks): a trailers-only response, the status in the headers,
		// which a client reads over HTTP/1.1 as well as HTTP/2.
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.Header().Set("Grpc-Status", "12") // UNIMPLEMENTED
		w.Header().Set("Grpc-Message", msg)
		w.WriteHeader(http.StatusOK)
		return
	}
	// The Connect protocol: its error JSON, with the HTTP status of its code.
	writeJSON(w, http.StatusNotFound, map[string]string{"code": "unimplemented", "message": msg})
}
