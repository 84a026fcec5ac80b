package spawner

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/buildkite/agent/v3/api"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

// register makes a new registration for the slot, saves it, then connects. The order
// matters after a kill -9: a registration that was never saved was never connected, so
// no connected agent is ever forgotten.
func (sl *slot) register(ctx context.Context) bool {
	sl.stopHeartbeat()
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%d", sl.s.cfg.Name, sl.index)
	defer func() { sl.s.health.tried(sl.index, sl.state.registered()) }()
	reg, err := sl.base.Register(ctx, &api.AgentRegisterRequest{
		Name:              name,
		Hostname:          host,
		OS:                runtime.GOOS,
		Arch:              runtime.GOARCH,
		ScriptEvalEnabled: true,
		Version:           sl.s.cfg.Version,
		Build:             "buildkite-operator",
		Tags:              sl.s.cfg.allTags(),
		Priority:          sl.s.cfg.Priority,
		PID:               os.Getpid(),
		Features:          sl.s.cfg.features(),
	})
	if err != nil {
		if ctx.Err() == nil {
			sl.log.Error(err, "cannot register the slot's agent; retrying", "agent", name)
			sleep(ctx, registerRetry)
		}
		return false
	}
	sl.state.AgentID, sl.state.AgentName, sl.state.AccessToken = reg.UUID, reg.Name, reg.AccessToken
	sl.state.Endpoint = sl.followEndpoint(reg.Endpoint, sl.base.Endpoint())
	sl.state.PingInterval, sl.state.HeartbeatInterval = reg.PingInterval, reg.HeartbeatInterval
	sl.api = sl.client()
	if !sl.save(ctx) {
		// Shutting down with a registration that was never connected: let it go.
		_ = sl.api.Disconnect(context.WithoutCancel(ctx))
		sl.state.clearRegistration()
		return false
	}
	if err := sl.api.Connect(ctx); err != nil {
		sl.log.Error(err, "cannot connect the agent; will retry", "agent", reg.UUID)
		// The registration is saved; the next round connects it again.
		return false
	}
	sl.log.Info("agent registered", "agent", reg.UUID, "name", reg.Name)
	sl.startHeartbeat()
	return true
}

// dropRegistration forgets the slot's registration (disconnecting it first when it may
// still be valid), so that the next round registers anew.
func (sl *slot) dropRegistration(ctx context.Context, disconnect bool) {
	sl.stopHeartbeat()
	if disconnect && sl.api != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		if err := sl.api.Disconnect(dctx); err != nil {
			sl.log.Info("cannot disconnect the old registration", "agent", sl.state.AgentID, "error", err.Error())
		}
		cancel()
	}
	sl.state.clearRegistration()
	sl.api = nil
	sl.save(ctx)
}

func (sl *slot) startHeartbeat() {
	sl.stopHeartbeat()
	interval := time.Duration(max(sl.state.HeartbeatInterval, 1)) * time.Second
	if sl.state.HeartbeatInterval <= 0 {
		interval = 5 * time.Second
	}
	c := sl.api
	sl.hb = sl.s.heartbeats.start(interval, func(ctx context.Context) bool {
		err := c.Heartbeat(ctx)
		sl.s.health.tried(sl.index, true)
		switch {
		case err == nil, ctx.Err() != nil:
		case agentapi.IsPermanent(err):
			// A revoked agent (401): the slot replaces its registration.
			sl.log.Info("heartbeat refused; the slot registers anew", "error", err.Error())
			select {
			case sl.reregister <- struct{}{}:
			default:
			}
			return false
		default:
			sl.log.Error(err, "heartbeat failed")
		}
		return true
	})
}

// stopHeartbeat stops the registration's heartbeats, and its streaming ping: both belong
// to the registration, which is going or changing.
func (sl *slot) stopHeartbeat() {
	sl.stopStream()
	if sl.hb != nil {
		sl.s.heartbeats.stop(sl.hb)
		sl.hb = nil
	}
}

// checkReregister replaces the registration when the heartbeat saw it revoked.
func (sl *slot) checkReregister(ctx context.Context) {
	select {
	case <-sl.reregister:
		sl.dropRegistration(ctx, false)
	default:
	}
}

// goAway ends an idle slot: it tells Buildkite the agent stops and disconnects it, then
// deletes the slot's Secret.
func (sl *slot) goAway(ctx context.Context) {
	sl.stopHeartbeat()
	if sl.state.registered() && sl.api != nil {
		sctx, cancel := context.WithTimeout(ctx, stopTimeout)
		if err := sl.api.Stop(sctx, false); err != nil {
			sl.log.Info("cannot tell Buildkite the agent stops", "error", err.Error())
		}
		if err := sl.api.Disconnect(sctx); err != nil {
			sl.log.Info("cannot disconnect the agent", "error", err.Error())
		}
		cancel()
	}
	dctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	if err := sl.s.store.delete(dctx, sl.index); err != nil {
		sl.log.Error(err, "cannot delete the slot's state")
	}
	sl.state.clearRegistration()
}

// followEndpoint is the endpoint Buildkite names (a registration's, a ping's, a job's)
// when the operator allows it (Config.EndpointAllowed), else current: job tokens go only
// to the endpoints a platform team configured, whatever a response says.
func (sl *slot) followEndpoint(named, current string) string {
	switch {
	case named == "" || named == current:
		return current
	case sl.s.cfg.EndpointAllowed(named):
		return named
	}
	sl.log.Info("Buildkite named an agent endpoint the operator does not allow; staying on the current one (list it in --allowed-agent-endpoints to follow)",
		"named", named, "current", current)
	return current
}
