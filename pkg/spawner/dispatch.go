package spawner

import (
	"context"
	"slices"
	"time"
)

// How an offer reached the slot.
const (
	viaPing   = "ping"
	viaStream = "stream"
)

// offer is what Buildkite told a slot, by a ping's answer or over the streaming ping: an
// action ("" when not paused, "pause", "disconnect", "stop"), Buildkite's words with it, and
// perhaps a job.
type offer struct {
	action, message, jobID string
	via                    string
}

// recentJobs is how many of the jobs it accepted a slot remembers, to refuse a second
// offer of one: a job pushed over the stream may also come in a ping's answer.
const recentJobs = 16

// awaitWork is an idle slot's turn to learn what Buildkite has for it, per the ping mode:
// what its streaming ping said, else a ping (always in ping-only; in auto while the stream
// is down, refused, or slow to say anything), else a wait for the stream.
//
// Only this goroutine accepts jobs, whichever way they came, one at a time: the stream
// queues what it hears (streamBox) and the slot takes it when it is free, so a ping and
// the stream never accept at once, and a job offered by both is accepted once (took).
func (sl *slot) awaitWork(ctx context.Context) {
	sl.checkReregister(ctx)
	if !sl.state.registered() {
		return
	}
	if !sl.s.cfg.streams() {
		sl.pingOnce(ctx)
		return
	}
	ps := sl.openStream()
	if o, ok := ps.box.take(); ok {
		sl.act(ctx, o)
		return
	}
	health, since := ps.box.state()
	if health == streamRevoked {
		// The agent would exit; a slot registers anew, as after a ping's 401.
		sl.log.Info("the streaming ping was refused; the slot registers anew", "agent", sl.state.AgentID)
		sl.dropRegistration(ctx, false)
		return
	}
	// A stream that has said nothing yet is given a ping interval before the slot polls:
	// Buildkite answers a working one at once.
	grace := time.Duration(max(sl.state.PingInterval, 1)) * time.Second
	polling := health == streamDown || health == streamRefused || (health == streamConnecting && time.Since(since) >= grace)
	if polling && sl.s.cfg.polls() {
		sl.pingOnce(ctx)
		return
	}
	var until <-chan time.Time
	if health == streamConnecting && sl.s.cfg.polls() {
		t := time.NewTimer(time.Until(since.Add(grace)))
		defer t.Stop()
		until = t.C
	}
	select {
	case <-ctx.Done():
	case <-ps.box.changed():
	case <-sl.reregister:
		sl.dropRegistration(ctx, false)
	case <-until:
	}
}

// idle waits d between pings, or less: until the streaming ping, if the slot has one,
// says something or changes, for the slot to act on it at once.
func (sl *slot) idle(ctx context.Context, d time.Duration) {
	if sl.stream == nil {
		sleep(ctx, d)
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-sl.stream.box.changed():
	}
}

// act does what Buildkite told the slot, by a ping or over the stream, as the agent does.
// It reports whether the slot is to wait before it asks again (nothing to do, or paused).
func (sl *slot) act(ctx context.Context, o offer) (rest bool) {
	switch o.action {
	case "disconnect":
		sl.log.Info("Buildkite asked the agent to disconnect; the slot registers anew later",
			"agent", sl.state.AgentID, "message", o.message, "after", sl.s.cfg.ReregisterAfter, "via", o.via)
		// The agent that comes next is a new one, which nobody has paused.
		sl.state.hold("", "", time.Now())
		sl.dropRegistration(ctx, true)
		sleep(ctx, sl.s.cfg.ReregisterAfter)
		return false
	case "pause":
		// Paused: the agent keeps its registration, heartbeats and pings (or stream), and
		// takes no job (a job the ping names anyway is ignored, as the agent ignores it)
		// until Buildkite no longer says pause.
		switch {
		case !sl.state.paused():
			sl.log.Info("Buildkite paused the agent: the slot takes no job until it is resumed", "agent", sl.state.AgentID, "message", o.message)
			sl.state.hold(SlotPaused, o.message, time.Now())
			sl.save(ctx)
		case sl.state.HeldMessage != o.message:
			// Paused again, with another note: the Secret shows the latest.
			sl.state.HeldMessage = o.message
			sl.save(ctx)
		}
		sl.setGauge("paused")
		return true
	case "stop":
		sl.stopByBuildkite(ctx, o.message)
		return false
	}
	if sl.state.paused() {
		sl.log.Info("Buildkite resumed the agent: the slot takes jobs again", "agent", sl.state.AgentID)
		sl.state.hold("", "", time.Now())
		sl.save(ctx)
		sl.setGauge("idle")
	}
	switch {
	case o.jobID == "":
		return true
	case sl.drain:
		return false
	case sl.took(o.jobID):
		sl.log.V(1).Info("Buildkite offered a job this slot has accepted already; not accepting it again", "job", o.jobID, "via", o.via)
		return true
	}
	sl.accept(ctx, o.jobID)
	return false
}

// took reports whether the slot accepted job id lately.
func (sl *slot) took(id string) bool { return slices.Contains(sl.recent, id) }

// remember records that the slot accepted job id.
func (sl *slot) remember(id string) {
	if sl.took(id) {
		return
	}
	if len(sl.recent) == recentJobs {
		sl.recent = slices.Delete(sl.recent, 0, 1)
	}
	sl.recent = append(sl.recent, id)
}

// heldOffer is the job Buildkite offered the slot and is keeping for it, neither accepted
// nor given back: the last ping's, or one the stream pushed that the slot has not taken.
func (sl *slot) heldOffer() string {
	if sl.offered != "" {
		return sl.offered
	}
	if sl.stream != nil {
		for _, id := range sl.stream.box.queued() {
			if !sl.took(id) {
				return id
			}
		}
	}
	return ""
}
