package fakebuildkite

import (
	"errors"
	"net/http"
	"slices"

	"connectrpc.com/connect"
)

// How a job reached the agent that took it: JobSnapshot.OfferedVia and AcceptedVia.
const (
	ViaPing    = "ping"    // a ping's answer
	ViaStream  = "stream"  // a job_assigned message of the streaming ping
	ViaAcquire = "acquire" // taken by name (--acquire-job), never offered
)

// The messages of the actions the control API sets, on a ping and on the stream alike.
const (
	pauseMessage      = "Paused by the fake's control API"
	disconnectMessage = "Disconnect requested by the fake's control API"
	stopMessage       = "Stop requested by the fake's control API"
)

// pushJobsLocked assigns waiting jobs to the agents whose streaming ping is open and who
// can take one, and pushes each its job: Buildkite dispatches to a streaming agent at once,
// where a polling one waits for its next ping. It runs on every change of the fake's state
// (notifyLocked), so a job is pushed as soon as it is scheduled or an agent frees up.
func (s *Server) pushJobsLocked() {
	if len(s.streams) == 0 {
		return
	}
	var free []*agent
	for id := range s.streams {
		if a := s.agents[id]; s.canPushLocked(a) {
			free = append(free, a)
		}
	}
	if len(free) == 0 {
		return
	}
	// The longest registered first, for an order tests can rely on.
	slices.SortFunc(free, func(a, b *agent) int { return a.registeredAt.Compare(b.registeredAt) })
	// Jobs before firstLive are all over: a job never comes back from its end.
	for s.firstLive < len(s.jobOrder) && IsTerminal(s.jobs[s.jobOrder[s.firstLive]].state) {
		s.firstLive++
	}
	for _, id := range s.jobOrder[s.firstLive:] {
		j := s.jobs[id]
		if j.state != StateScheduled {
			continue
		}
		for i, a := range free {
			if !rulesMatch(j.rules, a.tags) {
				continue
			}
			j.state, j.assignedTo = StateAssigned, a.id
			j.offeredVia = append(j.offeredVia, ViaStream)
			a.currentJob = j.id
			s.streams[a.id].send(jobAssigned(j.id))
			s.logf("fake buildkite: job %s pushed to agent %s over its streaming ping", j.id, a.id)
			free = slices.Delete(free, i, i+1)
			break
		}
		if len(free) == 0 {
			return
		}
	}
}

// canPushLocked: a is connected, takes dispatches, is not paused or told to go, and holds
// no job that is not over.
func (s *Server) canPushLocked(a *agent) bool {
	if a == nil || a.state != AgentConnected || a.revoked || a.ignoreInDispatches || a.action != ActionIdle {
		return false
	}
	if a.currentJob == "" {
		return true
	}
	j, ok := s.jobs[a.currentJob]
	return !ok || IsTerminal(j.state)
}

// faultOpenStreamsLocked applies a fault on the streaming ping to the streams open when it
// is injected, as it applies to the streams opened later: a stream is one long request,
// and a fault means to end it. DropConnection cuts the stream (no status, the connection
// closed); Status ends it with the gRPC code of that HTTP status, as Buildkite's proxy
// would. Each stream ended counts as one of f's Times; it reports false once they are
// used up.
func (s *Server) faultOpenStreamsLocked(f *faultState) bool {
	if f.Endpoint != EPStreamPings || (!f.DropConnection && f.Status == 0) {
		return true
	}
	for id, st := range s.streams {
		if f.left == 0 {
			return false
		}
		if f.AgentID != "" && f.AgentID != id {
			continue
		}
		if f.DropConnection {
			st.stop(streamEnd{drop: true})
		} else {
			msg := f.Message
			if msg == "" {
				msg = "Injected fault: " + http.StatusText(f.Status)
			}
			st.stop(streamEnd{err: connect.NewError(codeOfStatus(f.Status), errors.New(msg))})
		}
		f.hits++
		if f.left > 0 {
			f.left--
		}
	}
	return f.left != 0
}

// codeOfStatus is the gRPC code a client reads from an HTTP status in place of a gRPC
// response (the gRPC spec's mapping, which ConnectRPC follows).
func codeOfStatus(status int) connect.Code {
	switch status {
	case http.StatusBadRequest:
		return connect.CodeInternal
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusForbidden:
		return connect.CodePermissionDenied
	case http.StatusNotFound:
		return connect.CodeUnimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return connect.CodeUnavailable
	}
	return connect.CodeUnknown
}
