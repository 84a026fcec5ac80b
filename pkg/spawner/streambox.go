package spawner

import (
	"slices"
	"sync"
	"time"
)

// streamHealth is what a slot knows of its registration's streaming ping.
type streamHealth int

const (
	// streamConnecting: opening, or open with nothing said yet.
	streamConnecting streamHealth = iota
	// streamUp: it has said something since it opened: Buildkite tells the slot its
	// actions and jobs over it, and the slot does not poll.
	streamUp
	// streamDown: it failed and is being opened again; a slot in auto mode polls meanwhile.
	streamDown
	// streamRefused: Buildkite does not offer it here (unimplemented, permission denied):
	// for good, for this registration.
	streamRefused
	// streamRevoked: Buildkite refused the registration's token (401).
	streamRevoked
)

func (h streamHealth) String() string {
	return [...]string{"connecting", "up", "down", "refused", "revoked"}[h]
}

// Stream actions, as streamBox holds them until the slot takes them.
const (
	streamResume     = "resume"
	streamPause      = "pause"
	streamDisconnect = "disconnect"
)

// streamBox hands what the stream heard to the slot's goroutine, which alone accepts
// jobs (whichever way they came) and acts on Buildkite's actions: the stream never waits
// for the slot, and the slot takes, when it is free, the one action that matters and the
// jobs pushed meanwhile. A stream keeps talking while the slot runs a job (where pings
// stop), so what came meanwhile is boiled down as the agent does: a disconnect stands
// until taken; a later pause or resume replaces an earlier one; jobs queue once each.
type streamBox struct {
	mu      sync.Mutex
	health  streamHealth
	since   time.Time // when health last changed
	action  string    // the action not yet taken, or ""
	message string    // Buildkite's words with it
	jobs    []string  // pushed and not yet taken, in order
	// held: the slot took a pause and nothing came since: jobs pushed before it wait for
	// the next word from Buildkite.
	held bool
	wake chan struct{} // something changed (capacity 1)
}

func newStreamBox() *streamBox {
	return &streamBox{since: time.Now(), wake: make(chan struct{}, 1)}
}

// changed is signalled when health changes or something comes for the slot.
func (b *streamBox) changed() <-chan struct{} { return b.wake }

func (b *streamBox) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// setHealth records h; it reports whether it changed.
func (b *streamBox) setHealth(h streamHealth) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.health == h {
		return false
	}
	b.health, b.since = h, time.Now()
	b.poke()
	return true
}

// state is the stream's health, and since when.
func (b *streamBox) state() (streamHealth, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.health, b.since
}

// putAction records an action Buildkite sent.
func (b *streamBox) putAction(action, message string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.action != streamDisconnect {
		b.action, b.message = action, message
	}
	if action != streamPause {
		b.held = false
	}
	b.poke()
}

// putJob records a job Buildkite pushed.
func (b *streamBox) putJob(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !slices.Contains(b.jobs, id) {
		b.jobs = append(b.jobs, id)
	}
	b.held = false
	b.poke()
}

// take returns what the slot is to act on next, if anything: the pending action, with the
// first job queued unless it is a pause or a disconnect; else the first job queued.
func (b *streamBox) take() (offer, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.action == "" && (len(b.jobs) == 0 || b.held) {
		return offer{}, false
	}
	o := offer{action: b.action, message: b.message, via: viaStream}
	if o.action == streamResume {
		o.action = "" // as a ping that says nothing: not paused
	}
	if o.action == "" && len(b.jobs) > 0 {
		o.jobID, b.jobs = b.jobs[0], b.jobs[1:]
	}
	b.held = o.action == streamPause
	b.action, b.message = "", ""
	return o, true
}

// queued are the jobs pushed and not taken, in order.
func (b *streamBox) queued() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.jobs)
}
