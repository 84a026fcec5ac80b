package spawner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

	gauge string // "busy" or "idle": what the slots gauge counts this slot as

	hb         *beat         // the registration's heartbeats, nil when they are stopped
	reregister chan struct{} // the heartbeat saw a 401
}

// stoppedRecheck is how often a slot that Buildkite stopped looks at its Secret for a
// person letting it go (see stayStopped). A variable for tests.
var stoppedRecheck = time.Minute

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

// stopByBuildkite ends the slot as an agent that Buildkite told to stop ends: it takes
// no more jobs (it holds none: a slot pings only between jobs, so the job it ran is over)
// and disconnects. Where the agent process would exit, the slot stays down, and says so in
// its Secret, its log and the slots gauge, rather than register anew: Buildkite is asked
// to stop an agent to take it out of service, which a new registration a minute later
// would quietly undo. Its Secret keeps it down across restarts of the operator, until a
// person lets it go (stayStopped).
func (sl *slot) stopByBuildkite(ctx context.Context, message string) {
	sl.log.Info("Buildkite told the agent to stop: the slot disconnects and stays down; remove the annotation "+AnnotationSlotState+" from its Secret (or delete the Secret) to bring it back",
		"agent", sl.state.AgentID, "message", message, "secret", SlotSecretName(sl.s.cfg.Name, sl.index))
	// The mark is saved before the disconnect: a spawner killed in between resumes a
	// stopped slot, which lets its registration go, rather than connect it again.
	sl.state.hold(SlotStopped, message, time.Now())
	sl.save(ctx)
	sl.dropRegistration(ctx, true)
}

// stayStopped keeps a slot that Buildkite stopped down until a person lets it go: its
// Secret loses the stopped annotation, or is deleted. It looks every stoppedRecheck, and
// returns when the slot may register again, or ctx ends.
func (sl *slot) stayStopped(ctx context.Context) {
	if sl.state.registered() {
		// Stopped by an earlier spawner that was killed before it disconnected.
		sl.dropRegistration(ctx, true)
	}
	sl.stopHeartbeat()
	sl.setGauge("stopped")
	sl.s.health.stopped(sl.index, true)
	for sleep(ctx, stoppedRecheck) {
		var sec corev1.Secret
		err := sl.s.r.Get(ctx, client.ObjectKey{Namespace: sl.s.cfg.Namespace, Name: SlotSecretName(sl.s.cfg.Name, sl.index)}, &sec)
		switch {
		case apierrors.IsNotFound(err):
			sl.secret = nil
		case err != nil:
			if ctx.Err() == nil {
				sl.log.Error(err, "cannot read the stopped slot's Secret; looking again later")
			}
			continue
		case sec.Annotations[AnnotationSlotState] == SlotStopped:
			continue
		default:
			sl.secret = &sec
		}
		sl.log.Info("the stopped slot was let go of: it registers a new agent")
		sl.state.hold("", "", time.Now())
		sl.s.health.stopped(sl.index, false)
		sl.setGauge("idle")
		return
	}
}

// accept takes the job a ping offered. The Accepting marker is saved first, so that a
// spawner killed during the accept asks again (an accept by the same agent is answered
// with the same job) instead of leaving the job accepted and forgotten.
func (sl *slot) accept(ctx context.Context, jobID string) {
	sl.state.Accepting, sl.state.Intake = jobID, newIntakeNonce()
	if !sl.save(ctx) {
		sl.state.Accepting, sl.state.Intake = "", ""
		sl.offered = jobID
		return
	}
	sl.setGauge("busy")
	sl.finishAccept(ctx)
}

// finishAccept accepts the job named by the Accepting marker until Buildkite answers.
func (sl *slot) finishAccept(ctx context.Context) {
	jobID := sl.state.Accepting
	for ctx.Err() == nil {
		job, err := sl.api.Accept(ctx, jobID)
		switch {
		case err == nil:
			if job.ID == "" {
				job.ID = jobID
			}
			acceptedMetric.WithLabelValues(sl.s.cfg.Name).Inc()
			sl.remember(jobID)
			sl.log.Info("job accepted", "job", job.ID)
			raw, err := json.Marshal(job)
			if err != nil {
				// api.Job always encodes; should it not, the job is still failed properly.
				raw = nil
			}
			sl.state.Accepting = ""
			sl.state.JobID, sl.state.JobToken, sl.state.Job = job.ID, job.Token, raw
			// Not saved: the Secret keeps the Accepting marker, which is enough to resume
			// (resumeAccepting), and a write per job less. The job's BuildJob, named after
			// it, and its token Secret hold the rest once they exist.
			return
		case ctx.Err() != nil:
			return
		case acceptRefused(agentapi.StatusCode(err)):
			// Buildkite answered no (422: taken by another agent, canceled, finished).
			sl.log.Info("Buildkite refused the accept; pinging again", "job", jobID, "error", err.Error())
			sl.state.Accepting, sl.state.Intake = "", ""
			sl.save(ctx)
			return
		default:
			// No answer: a network error, a 5xx or a 429. The job may already be this
			// agent's (a resumed slot accepts again): dropping it would leave it accepted
			// on Buildkite for ever.
			sl.log.Error(err, "cannot reach Buildkite to accept the job; retrying", "job", jobID)
			sleep(ctx, registerRetry)
		}
	}
}

// acceptRefused reports whether an accept answered with this HTTP status was refused: a
// 4xx other than 429 (Too Many Requests). 0 (no answer), a 429 or a 5xx is no answer and
// the accept is tried again.
func acceptRefused(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusTooManyRequests
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

// resumeAccepting takes up, after a restart, the job of the slot's Accepting marker: the
// only record of a job that a slot writes when all goes well. false: ctx ended first.
//
//   - Its BuildJob is reported: the job is over for the slot, which goes idle (unless
//     the controller let it go of for want of its token Secret: the job is then
//     accepted again, for its token, and finished by the slot).
//   - Its BuildJob exists with its token Secret: the job in hand is made from them, and
//     the slot waits for the BuildJob as it did before the restart (the pod may be running:
//     nothing is checked again).
//   - Otherwise the job is accepted again: Buildkite answers an accept by the same agent
//     with the job, or refuses one that is over. A job that has started without a
//     BuildJob had one that was deleted unreported while the spawner was down: it is
//     failed, as waitReported would have, rather than run a second time.
func (sl *slot) resumeAccepting(ctx context.Context) bool {
	id := sl.state.Accepting
	bj, token, err := sl.s.findBuildJob(ctx, id, sl.state.Intake)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return false
		}
		sl.log.Error(err, "cannot look up the BuildJob of the job being accepted; accepting it again", "job", id)
	case bj != nil && bj.Status.Times.ReportedAt != nil && !givenUpWithoutToken(bj):
		sl.log.Info("the job of the resumed slot is over", "job", id, "buildjob", bj.Name)
		sl.state.clearJob()
		return true
	case bj != nil && token != "":
		job := api.Job{ID: id, Token: token, Endpoint: bj.Spec.AgentEndpoint}
		if n := bj.Spec.LogLimits.ChunksMaxSizeBytes; n > 0 {
			job.ChunksMaxSizeBytes = uint64(n)
		}
		raw, _ := json.Marshal(job)
		sl.state.Accepting = ""
		sl.state.JobID, sl.state.JobToken, sl.state.Job, sl.state.BuildJob = id, token, raw, bj.Name
		sl.log.Info("the resumed slot waits for its job's BuildJob", "job", id, "buildjob", bj.Name)
		return true
	}
	sl.finishAccept(ctx)
	if sl.state.JobID == "" {
		return ctx.Err() == nil
	}
	var job api.Job
	if json.Unmarshal(sl.state.Job, &job) == nil && bj == nil && job.State != "" && job.State != "accepted" && job.State != "assigned" {
		sl.state.BuildJob = BuildJobName(id) // gone: intake fails the job
	}
	return true
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
