package fakebuildkite

import "fmt"

// ActionStop is the ping action of an agent told to stop (as Buildkite's "Stop agent"
// does): the agent finishes the job it runs, if any, then disconnects and takes no more.
// Pings only carry it between jobs: an agent does not ping while it runs one. The
// streaming ping has no such action: an agent's open stream is ended instead (and a new
// one refused while the action holds), so that the agent pings and hears it there.
const ActionStop = "stop"

// SendAgentAction sets the action every later ping of the agent answers with, until it
// is changed: ActionIdle (resume), ActionPause, ActionDisconnect or ActionStop. A paused
// agent is offered no job; one told to disconnect or stop is offered none either.
func (s *Server) SendAgentAction(id, action string) error {
	if action != ActionStop {
		return s.SetAgentAction(id, action)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.agents[id]
	if !ok {
		return fmt.Errorf("fake buildkite: no agent %q", id)
	}
	a.action = action
	if st := s.streams[id]; st != nil {
		s.tellActionLocked(a, st) // ends the stream: the agent pings, and hears it there
	}
	s.logf("fake buildkite: agent %s told to stop", id)
	s.notifyLocked()
	return nil
}
