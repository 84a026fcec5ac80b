package spawner

import (
	"context"
	"encoding/json"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

type slotSecret struct {
	sec   *corev1.Secret
	state slotState
}

// slot is one agent registration running one job at a time. Only its own goroutine
// touches its fields, except its heartbeats (heartbeats), which read a copy of the client.
type slot struct {
	s     *Spawner
	index int
	// drain: the slot is beyond the pool size; it finishes its job, then goes away.
	drain bool
	base  *agentapi.Client // holds the registration token
	log   logr.Logger

	secret *corev1.Secret // last written version of the state Secret
	state  slotState
	// savedJob: the Secret holds more of the job in hand than its Accepting marker (a
	// save for another reason wrote it), so it is cleared when the job is over.
	savedJob bool
	api      *agentapi.Client // holds the agent access token
	// offered is the job the last ping offered, while it is neither accepted nor given
	// back: Buildkite keeps it for this agent until the agent's next ping, so a slot that
	// stops holding one keeps its registration (no disconnect) for the next spawner.
	offered string
	// stream is the registration's streaming ping while it runs (dispatch.go, stream.go);
	// recent are the jobs the slot accepted lately, which it never accepts twice.
	stream *pingStream
	recent []string
	// drawn is the intake nonce this process drew (accept): the job's BuildJob cannot
	// exist yet under a name with it, so its intake creates without looking first.
	drawn string

	gauge string // "busy" or "idle": what the slots gauge counts this slot as

	hb         *beat         // the registration's heartbeats, nil when they are stopped
	reregister chan struct{} // the heartbeat saw a 401
}

// Backoffs of a slot that cannot reach Buildkite or Kubernetes.
const (
	stateRetry    = 2 * time.Second
	registerRetry = 10 * time.Second
	resync        = time.Minute
	stopTimeout   = 10 * time.Second
)

func (sl *slot) run(ctx context.Context) {
	sl.reregister = make(chan struct{}, 1)
	defer sl.leaveHeartbeat()
	defer sl.setGauge("")
	defer sl.stopStream() // before leaveHeartbeat: a lingering slot takes nothing
	if sl.state.registered() {
		sl.api = sl.client()
	}
	for ctx.Err() == nil {
		if sl.state.busy() {
			sl.setGauge("busy")
		} else {
			if sl.state.stopped() {
				if sl.drain {
					sl.goAway(ctx) // going away anyway
					return
				}
				sl.stayStopped(ctx)
				continue
			}
			// A paused slot beyond the pool waits to be resumed before it goes, as an
			// agent due to disconnect (after its idle time or uptime) does while paused:
			// whoever paused it may want it kept.
			if sl.drain && !sl.state.paused() {
				sl.goAway(ctx)
				return
			}
			sl.setGauge(sl.idleGauge())
			if sl.s.kubeGivenUp() {
				// Neither pinging nor streaming: Buildkite keeps the jobs in its queue, for
				// another operator, rather than push them to a slot that cannot run them.
				sl.stopStream()
				sl.s.probeKube(ctx, sl.index)
				continue
			}
		}
		if !sl.state.registered() {
			if !sl.register(ctx) {
				continue
			}
		} else if sl.hb == nil {
			// Resumed from a Secret: connect again under the same registration.
			if err := sl.api.Connect(ctx); err != nil {
				if agentapi.IsPermanent(err) {
					sl.log.Info("the stored registration is no longer valid; registering anew", "agent", sl.state.AgentID, "error", err.Error())
					sl.dropRegistration(ctx, false)
					continue
				}
				sl.log.Error(err, "cannot connect the agent; retrying")
				sleep(ctx, registerRetry)
				continue
			}
			sl.s.health.tried(sl.index, true)
			sl.startHeartbeat()
		}
		if sl.s.cfg.streams() {
			// The stream belongs to the registration, busy or not, as the agent's does: one
			// resumed with a job in hand opens it too, and what it says meanwhile waits.
			sl.openStream()
		}
		if sl.state.busy() {
			sl.handleJob(ctx)
			continue // and ping again at once
		}
		sl.awaitWork(ctx)
	}
	switch {
	case sl.state.busy():
	case sl.state.stopped():
		// Stopped by Buildkite: its Secret keeps it down for the next spawner too.
	case sl.heldOffer() != "":
		// Its heartbeat stops with the slot (leaveHeartbeat).
		sl.log.Info("stopping with a job offered and not accepted: the agent stays registered, for the next spawner to take the job or give it back",
			"agent", sl.state.AgentID, "job", sl.heldOffer())
	default:
		sl.goAway(context.WithoutCancel(ctx))
	}
}

// idleGauge is what the slots gauge counts a slot without a job as: paused while
// Buildkite holds it, else idle.
func (sl *slot) idleGauge() string {
	if sl.state.paused() {
		return "paused"
	}
	return "idle"
}

func (sl *slot) setGauge(to string) {
	if sl.gauge != to {
		sl.s.slotChanged(sl.gauge, to)
		sl.gauge = to
	}
}

// client is the agent API client of the slot's registration.
func (sl *slot) client() *agentapi.Client {
	return sl.base.WithEndpoint(sl.state.Endpoint).WithToken(sl.state.AccessToken)
}

// save writes the slot's state, retrying until it lands or ctx ends: every step that
// depends on the state waits for it. Once the API server has been unreachable for
// CreateTimeout it goes on without: waiting longer would hold the slot's job from Buildkite
// for as long as the outage lasts, where failing it tells its author at once. The price is
// that a restart of the operator before the API server answers again can lose track of it.
func (sl *slot) save(ctx context.Context) bool {
	for {
		sec, err := sl.s.store.save(ctx, sl.index, sl.secret, &sl.state)
		if err == nil {
			sl.secret = sec
			sl.savedJob = sl.state.JobID != ""
			sl.s.reach.ok()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		sl.s.reach.failed(err)
		if sl.s.kubeGivenUp() {
			sl.log.Error(err, "cannot save the slot's state; going on without it while the API server is unreachable")
			return true
		}
		sl.log.Error(err, "cannot save the slot's state; retrying")
		if !sleep(ctx, stateRetry) {
			return false
		}
	}
}

// handleJob takes a busy slot's job through intake to its end: accept (if the marker
// is all there is), BuildJob or failure, then waits for the job to be reported.
func (sl *slot) handleJob(ctx context.Context) {
	if sl.state.Accepting != "" && sl.state.JobID == "" {
		if !sl.resumeAccepting(ctx) {
			return
		}
		if sl.state.JobID == "" {
			sl.setGauge("idle")
			return
		}
	}
	job := sl.jobInHand()
	done := sl.intake(ctx, job)
	if !done {
		return // shutting down: the next instance resumes from the Secret
	}
	// The Secret is written again only when it holds more than the Accepting marker of
	// this job (a failure, or a registration saved meanwhile): a marker of a job that is
	// over costs the next instance one look at the job's BuildJob, and the next accept
	// overwrites it.
	dirty := sl.state.Failing != "" || sl.savedJob
	sl.state.clearJob()
	sl.savedJob = false
	if dirty {
		sl.save(ctx)
	}
	if sl.drain {
		return
	}
	sl.setGauge("idle")
}

// jobInHand is the accepted job the slot's state holds, with its token and the endpoint
// to report it to. When the stored job is unreadable, all that can be done is to fail it
// with its token: the state then says so.
func (sl *slot) jobInHand() *api.Job {
	var job api.Job
	if err := json.Unmarshal(sl.state.Job, &job); err != nil || job.ID != sl.state.JobID {
		job = api.Job{ID: sl.state.JobID}
		if sl.state.Failing == "" {
			sl.state.fail(&intakeError{IntakeInvalidJob, "the operator lost the job's details while restarting; retry the job"})
		}
	}
	job.Token = sl.state.JobToken
	job.Endpoint = sl.followEndpoint(job.Endpoint, sl.state.Endpoint)
	if job.Endpoint == "" {
		job.Endpoint = sl.base.Endpoint()
	}
	return &job
}
