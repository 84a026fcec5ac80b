package spawner

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// StaleAfter is how long a slot may go without trying to ping, register or heartbeat
// before the liveness check fails. It is far above any wait of a working slot (ping
// intervals are seconds, a Retry-After is capped, retries back off to 10 s), so it only
// fires for a slot whose loop is stuck, which a restart cures.
const StaleAfter = 10 * time.Minute

// health is what the probes know of the slots: which are registered with Buildkite, and
// when each last tried to reach it. A failing call counts as a try: an unreachable
// Buildkite is not cured by restarting the operator.
type health struct {
	mu         sync.Mutex
	started    bool
	registered map[int]bool
	lastTry    map[int]time.Time
	// down are the slots Buildkite stopped: they are down on purpose, neither pinging nor
	// registered, which no restart of the operator should try to cure.
	down map[int]bool
	now  func() time.Time
}

func newHealth() *health {
	return &health{registered: map[int]bool{}, lastTry: map[int]time.Time{}, down: map[int]bool{}, now: time.Now}
}

// stopped records that Buildkite stopped slot i (or, false, that it was let go of and
// tries to register again).
func (h *health) stopped(i int, down bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if down {
		h.down[i] = true
		return
	}
	delete(h.down, i)
	h.lastTry[i] = h.now()
}

// start marks the spawner running (this replica leads) with its slots not yet registered.
func (h *health) start(slots int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.started = true
	now := h.now()
	for i := range slots {
		h.registered[i] = false
		h.lastTry[i] = now
	}
}

// tried records that slot i just tried to reach Buildkite, and whether it is registered.
func (h *health) tried(i int, registered bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lastTry[i] = h.now()
	h.registered[i] = registered
}

// ready: every slot is registered but those Buildkite stopped, or the spawner does not
// run here (a standby replica, which serves the webhooks and is ready for that).
func (h *health) ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.started {
		return nil
	}
	n, want := 0, 0
	for i, ok := range h.registered {
		if h.down[i] {
			continue
		}
		want++
		if ok {
			n++
		}
	}
	if n < want {
		return fmt.Errorf("%d of %d slots are registered with Buildkite", n, want)
	}
	return nil
}

// live: no slot has gone StaleAfter without trying to reach Buildkite, but those
// Buildkite stopped, which stay down on purpose.
func (h *health) live() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	for i, t := range h.lastTry {
		if h.down[i] {
			continue
		}
		if d := now.Sub(t); d > StaleAfter {
			return fmt.Errorf("slot %d has not pinged or heartbeated for %s", i, d.Round(time.Second))
		}
	}
	return nil
}

// ReadyCheck is a readiness probe (healthz.Checker): it fails, on the leader, until every
// slot has registered with Buildkite, but those Buildkite stopped.
func (s *Spawner) ReadyCheck(*http.Request) error { return s.health.ready() }

// LiveCheck is a liveness probe (healthz.Checker): it fails when a slot's loop has stopped
// pinging or heartbeating.
func (s *Spawner) LiveCheck(*http.Request) error { return s.health.live() }
