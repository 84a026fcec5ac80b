package spawner

import (
	"context"
	"time"
)

// Lingering after a lost leader lease.
//
// The spawner runs on the leader only: two spawners resuming the same slots would ping
// and accept under the same registrations. The leader keeps its lease by renewing it
// through the API server, so an API server that cannot be reached for the renew deadline
// costs it the lease, and controller-runtime then stops everything at once. Were the
// heartbeats to stop with it, Buildkite would see every busy agent go silent for as long
// as the outage lasts (and mark them lost after a few minutes), although their jobs' pods
// keep running and nothing is wrong with them.
//
// So a busy slot's heartbeat outlives Start, and the process may linger: heartbeats only,
// no ping, no accept, no write to the API server. That keeps exactly one active spawner,
// because what another replica does once it holds the lease does not conflict with it: it
// resumes the same registrations from their Secrets, and a second heartbeat for an agent
// changes nothing. The lingering process lets go as soon as the API server answers again:
// by then the new leader (or this process, restarted) can take the lease and resume the
// slots, heartbeats and all.

// lingerProbeTimeout bounds one question to the API server while lingering: an outage
// that drops packets would otherwise hold it for the client's own timeout.
const lingerProbeTimeout = 10 * time.Second

// leaveHeartbeat stops the slot's heartbeat as its goroutine ends, unless the slot holds
// a job: that heartbeat is left running for Linger or StopHeartbeats to end.
func (sl *slot) leaveHeartbeat() {
	if sl.hb == nil || !sl.state.busy() {
		sl.stopHeartbeat()
		return
	}
	sl.s.mu.Lock()
	defer sl.s.mu.Unlock()
	sl.s.lingering = append(sl.s.lingering, sl)
}

// Linger is for the process that ran the spawner, when its manager stopped without being
// asked to (it lost its leader lease, most often because the API server could not be
// reached): it keeps the heartbeats of the slots that were busy going until the API server
// answers again, or ctx ends (SIGTERM), then stops them. It waits for a Start under way to
// return first; it returns at once when Start never ran or no slot was busy.
func (s *Spawner) Linger(ctx context.Context) {
	defer s.StopHeartbeats()
	select {
	case <-s.started:
	default:
		return // the manager stopped before it started the spawner
	}
	select {
	case <-s.done:
	case <-ctx.Done():
		return
	}
	s.mu.Lock()
	n := len(s.lingering)
	s.mu.Unlock()
	if n == 0 {
		return
	}
	s.log.Info("the spawner stopped without being asked to: busy slots keep heartbeating, and take nothing, until the API server answers again", "busySlots", n)
	for {
		pctx, cancel := context.WithTimeout(ctx, lingerProbeTimeout)
		answers := s.kubeAnswers(pctx, 0)
		cancel()
		if answers {
			s.log.Info("the API server answers again: busy slots stop heartbeating, for the leader to resume them")
			return
		}
		if !sleep(ctx, stateRetry) {
			return
		}
	}
}

// StopHeartbeats stops the heartbeats that Start left running. Call it once Start has
// returned, before the process exits; Linger calls it itself.
func (s *Spawner) StopHeartbeats() {
	s.mu.Lock()
	slots := s.lingering
	s.lingering = nil
	s.mu.Unlock()
	for _, sl := range slots {
		sl.stopHeartbeat()
	}
}
