package spawner

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/buildkite/agent/v3/api"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

// accept takes the job a ping offered. The Accepting marker is saved first, so that a
// spawner killed during the accept asks again (an accept by the same agent is answered
// with the same job) instead of leaving the job accepted and forgotten.
func (sl *slot) accept(ctx context.Context, jobID string) {
	sl.state.Accepting, sl.state.Intake = jobID, newIntakeNonce()
	sl.drawn = sl.state.Intake
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
