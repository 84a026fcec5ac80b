package spawner

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/buildkite/agent/v3/api"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

// pingInterval is the registration's ping interval plus a jitter of up to as much
// again, as the agent does, so that the slots do not ping in step.
func (sl *slot) pingInterval() time.Duration {
	base := time.Duration(max(sl.state.PingInterval, 1)) * time.Second
	return base + rand.N(base)
}

// pingOnce pings, handles the answer and waits for the next ping when there was no job.
func (sl *slot) pingOnce(ctx context.Context) {
	sl.checkReregister(ctx)
	if !sl.state.registered() {
		return
	}
	wait := sl.pingInterval()
	p, err := sl.api.Ping(ctx)
	sl.s.health.tried(sl.index, true)
	switch {
	case ctx.Err() != nil:
		return
	case err == nil:
		sl.offered = "" // this ping took back any job offered before it
	case agentapi.IsPermanent(err):
		// 401: the agent was revoked or deleted. The agent would exit; a slot registers anew.
		sl.log.Info("ping refused; the slot registers anew", "agent", sl.state.AgentID, "error", err.Error())
		sl.dropRegistration(ctx, !agentapi.IsUnauthorized(err))
		return
	default:
		// 429, 5xx, network: try again on the next tick, or when Buildkite says.
		if ra := retryAfter(err); ra > 0 {
			wait = ra
		}
		sl.log.V(1).Info("ping failed; trying again", "error", err.Error(), "wait", wait)
		sl.idle(ctx, wait)
		return
	}
	if p.Endpoint != "" && p.Endpoint != sl.state.Endpoint && sl.followEndpoint(p.Endpoint, sl.state.Endpoint) == p.Endpoint {
		sl.log.Info("Buildkite moved the agent to another endpoint", "endpoint", p.Endpoint)
		sl.state.Endpoint = p.Endpoint
		sl.api = sl.client()
		sl.save(ctx)
		sl.startHeartbeat() // and the streaming ping opens at the new endpoint
	}
	o := offer{action: p.Action, message: p.Message, via: viaPing}
	if p.Job != nil {
		o.jobID = p.Job.ID
	}
	if sl.act(ctx, o) {
		sl.idle(ctx, wait)
	}
}

// retryAfter reads a Retry-After header (seconds) from a failed call.
func retryAfter(err error) time.Duration {
	var er *api.ErrorResponse
	if !errors.As(err, &er) || er.Response == nil {
		return 0
	}
	if er.Response.StatusCode != http.StatusTooManyRequests && er.Response.StatusCode < 500 {
		return 0
	}
	s, perr := strconv.Atoi(er.Response.Header.Get("Retry-After"))
	if perr != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}
