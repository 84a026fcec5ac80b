package spawner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/buildkite/agent/v3/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// FailurePrefix starts the explanation written into the log of a job the operator could
// not run.
const FailurePrefix = "buildkite-operator could not run this job: "

// intake turns the slot's job into a BuildJob, or fails it in Buildkite, then waits
// until the job is over for the slot. It returns false when ctx ended first; the slot's
// Secret then still holds the job for the next instance.
//
// A slot resumed with its BuildJob made (state.BuildJob) only waits for it: the job was
// checked when it was accepted, and its pod may be running; what changed since (its
// BuildEnvironment deleted or narrowed) is for the controller to judge, not a reason to
// fail a running job.
func (sl *slot) intake(ctx context.Context, job *api.Job) bool {
	if sl.state.Failing == "" {
		if sl.state.BuildJob == "" {
			// What the agent that accepts a job checks before its bootstrap runs, before
			// anything of the job exists here: a job refused now gets no BuildJob, no token
			// Secret and no pod. A resumed slot without its BuildJob checks again, against the
			// same job and (unless the operator was reconfigured) the same policy.
			run, ie := sl.admit(ctx, job)
			if ie != nil {
				return sl.decideFailure(ctx, job, ie)
			}
			fresh := sl.drawn != "" && sl.drawn == sl.state.Intake
			name, err := sl.s.creator.create(ctx, run, sl.state.Intake, fresh)
			if err != nil {
				if ctx.Err() != nil {
					return false
				}
				var ie *intakeError
				if !errors.As(err, &ie) {
					ie = &intakeError{IntakeAPIUnavailable, err.Error()}
				}
				// Decided once: a resumed slot keeps failing the job with the same words rather
				// than trying again and perhaps running a job whose log already has them.
				return sl.decideFailure(ctx, job, ie)
			}
			// Not saved: a resumed slot finds the BuildJob by the job's name.
			sl.state.BuildJob = name
		}
		end, over := sl.waitReported(ctx, sl.state.BuildJob)
		if !over {
			return false
		}
		switch end.state {
		case buildJobGone:
			// Deleted without a report (its finalizer removed by hand, or a BuildJob lost
			// with its cluster): nobody else will finish the job. Should Buildkite have it
			// finished already (reported while this slot was not looking), failJob sees so
			// and stops.
			return sl.decideFailure(ctx, job, &intakeError{IntakeBuildJobGone, fmt.Sprintf(
				"its BuildJob %s was deleted before the job's end was reported to Buildkite, so how the job ended is unknown. "+
					"Retry the job; a cluster operator can tell from the operator's events and logs why the BuildJob went away.",
				sl.state.BuildJob)})
		case buildJobUnreported:
			// The controller let the BuildJob go without its token: nothing else holds it
			// now, and the job would stay accepted or running on Buildkite until it timed
			// out. The token this slot accepted the job with still works until the job ends.
			return sl.decideFailure(ctx, job, &intakeError{IntakeTokenSecretMissing, tokenSecretMissingMessage(end)})
		}
		return true
	}
	reason, msg := sl.state.failure()
	return sl.failJob(ctx, job, reason, msg)
}

// admit applies the operator's job policy (Config.Policy) to the job as Buildkite sent it,
// and returns the job to make a BuildJob of: with the env the agent gives a job, and the
// lines the policy has for the top of its log. A job the policy refuses is an intake
// failure, its explanation the lines the agent would print.
func (sl *slot) admit(ctx context.Context, job *api.Job) (*api.Job, *intakeError) {
	d := sl.s.cfg.policy.Check(ctx, job)
	if d.Refusal != "" {
		return nil, &intakeError{refusalFailure(d.Refusal), d.Message}
	}
	run, ie := jobToRun(job, d)
	if ie != nil {
		return nil, ie
	}
	if d.Log != "" {
		// The first line says what the log opens with: the signature verified, or not.
		first, _, _ := strings.Cut(d.Log, "\n")
		sl.log.Info("job admitted with a note for its log", "job", job.ID, "note", strings.TrimLeft(first, "~+ "))
	}
	return run, nil
}

// decideFailure records that the job is to be failed, then fails it.
func (sl *slot) decideFailure(ctx context.Context, job *api.Job, ie *intakeError) bool {
	sl.state.fail(ie)
	if !sl.save(ctx) {
		return false
	}
	return sl.failJob(ctx, job, ie.reason, ie.msg)
}

// waitReported keeps the slot busy, heartbeating, until its BuildJob is reported to
// Buildkite, let go of unreported, or gone, and returns which. over is false when ctx
// ended first.
func (sl *slot) waitReported(ctx context.Context, name string) (end buildJobEnd, over bool) {
	wake, remove := sl.s.addWaiter(name)
	defer remove()
	for {
		end, err := sl.s.reported(ctx, name)
		if ctx.Err() != nil {
			return end, false
		}
		switch {
		case err != nil:
			sl.log.Error(err, "cannot read the job's BuildJob", "buildjob", name)
		case end.state == buildJobReported:
			return end, true
		case end.state == buildJobUnreported:
			sl.log.Info("the job's BuildJob was let go of without telling Buildkite; the slot finishes the job", "buildjob", name)
			return end, true
		case end.state == buildJobGone:
			sl.log.Info("the job's BuildJob was deleted before it was reported", "buildjob", name)
			return end, true
		}
		if !sl.state.registered() {
			sl.register(ctx)
		}
		t := time.NewTimer(resync)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-sl.reregister:
			sl.dropRegistration(ctx, false)
		case <-t.C:
		}
		t.Stop()
	}
}

// findBuildJob finds the BuildJob that the intake with this nonce made for job jobID
// (buildJobNames), reading from the API server, where the creator makes BuildJobs, and
// the job token from its Secret: nil when there is none, "" when its token is not in a
// Secret sealed for it. A BuildJob of the job's name that the intake did not make is
// passed over, as the creator passes it over.
func (s *Spawner) findBuildJob(ctx context.Context, jobID, nonce string) (*v1alpha1.BuildJob, string, error) {
	bj, _, err := s.creator.find(ctx, jobID, nonce)
	if err != nil || bj == nil {
		return nil, "", err
	}
	key, err := s.creator.seal.Key(ctx)
	if err != nil {
		return nil, "", err
	}
	var sec corev1.Secret
	ref := bj.Spec.TokenSecretRef
	err = s.r.Get(ctx, client.ObjectKey{Namespace: bj.Namespace, Name: ref.Name}, &sec)
	switch {
	case apierrors.IsNotFound(err):
		return bj, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("reading the token Secret of BuildJob %s: %w", bj.Name, err)
	case !key.TokenSecret(bj, &sec):
		// Not sealed: made before seals (the creator seals it when it completes the
		// BuildJob), or not the spawner's. Either way its token is not taken from it:
		// accepting the job again gives the token.
		return bj, "", nil
	}
	return bj, string(sec.Data[ref.KeyOrDefault()]), nil
}

// buildJobState is where a slot's BuildJob is, as far as the slot cares.
type buildJobState int

const (
	buildJobPending  buildJobState = iota // not yet reported
	buildJobReported                      // status.times.reportedAt is set
	// buildJobUnreported: status.times.reportedAt is set, but Buildkite was not told: the
	// Reported condition is False with reason TokenSecretMissing.
	buildJobUnreported
	buildJobGone // deleted
)

// buildJobEnd is where a slot's BuildJob is, and, for one let go of unreported, what the
// controller recorded of it.
type buildJobEnd struct {
	state buildJobState
	// tokenSecret names the BuildJob's token Secret.
	tokenSecret string
	// outcome is the message of its Finished condition: how the job ended, as far as the
	// controller could tell.
	outcome string
	// madeByHand: the controller took the BuildJob for one made by hand (one made by an
	// operator from before intake nonces has no intake annotation) and reported nothing.
	madeByHand bool
}

// reported tells whether the BuildJob is reported to Buildkite, let go of unreported, or
// gone. It reads the cache, but believes a NotFound only from the API server: a BuildJob
// just created may not be in the cache yet.
func (s *Spawner) reported(ctx context.Context, name string) (buildJobEnd, error) {
	key := client.ObjectKey{Namespace: s.cfg.JobNamespace, Name: name}
	var bj v1alpha1.BuildJob
	err := s.cfg.Cache.Get(ctx, key, &bj)
	if err != nil {
		err = s.r.Get(ctx, key, &bj)
	}
	switch {
	case apierrors.IsNotFound(err):
		return buildJobEnd{state: buildJobGone}, nil
	case err != nil:
		return buildJobEnd{state: buildJobPending}, err
	case bj.Status.Times.ReportedAt == nil:
		return buildJobEnd{state: buildJobPending}, nil
	}
	if !givenUpWithoutToken(&bj) {
		// Told, or told what it would take (Buildkite refused the finish, say): the job is
		// over for the slot.
		return buildJobEnd{state: buildJobReported}, nil
	}
	// givenUpWithoutToken found the Reported condition.
	rep := meta.FindStatusCondition(bj.Status.Conditions, v1alpha1.ConditionReported)
	end := buildJobEnd{state: buildJobUnreported, tokenSecret: bj.Spec.TokenSecretRef.Name, madeByHand: rep.Reason == v1alpha1.ReasonMadeByHand}
	if fin := meta.FindStatusCondition(bj.Status.Conditions, v1alpha1.ConditionFinished); fin != nil {
		end.outcome = fin.Message
	}
	return end, nil
}

// givenUpWithoutToken reports a BuildJob of the slot's that the controller let go of
// without telling Buildkite how its job ended: its token Secret was missing, or the
// BuildJob looked made by hand (made by an operator from before intake nonces). The job is
// not over, and the slot, which holds (or can get again) the job token, finishes it.
func givenUpWithoutToken(bj *v1alpha1.BuildJob) bool {
	rep := meta.FindStatusCondition(bj.Status.Conditions, v1alpha1.ConditionReported)
	return bj.Status.Times.ReportedAt != nil && rep != nil && rep.Status == metav1.ConditionFalse &&
		(rep.Reason == v1alpha1.ReasonTokenSecretMissing || rep.Reason == v1alpha1.ReasonMadeByHand)
}

// tokenSecretMissingMessage explains, for the job's log, a job that the slot finishes
// because its BuildJob was let go of without its token.
func tokenSecretMissingMessage(end buildJobEnd) string {
	outcome := end.outcome
	if outcome == "" {
		outcome = "nothing (it had not seen the job end)"
	}
	if end.madeByHand {
		return fmt.Sprintf("its BuildJob was made by an older version of the operator, which the controller could not report to Buildkite. "+
			"What the controller recorded of how the job ended: %s\n"+
			"The operator finished the job with the token it accepted the job with. Retry the job.", outcome)
	}
	return fmt.Sprintf("the job token Secret %s was deleted before the job's end was reported to Buildkite, so the operator's controller could not report it. "+
		"What the controller recorded of how the job ended: %s\n"+
		"The operator stopped following the job, and finished it with the token it accepted the job with. "+
		"Retry the job; a cluster operator can tell from the BuildJob's events why its token Secret went away.",
		end.tokenSecret, outcome)
}

// failJob ends a job that cannot run (or whose BuildJob is gone, or was let go of without
// its token) as Buildkite expects of an agent that refuses or stops one: start it (unless
// it runs), explain in its log, finish it with -1 and the signal reason of reason. It
// returns false when ctx ended first.
func (sl *slot) failJob(ctx context.Context, job *api.Job, reason IntakeFailure, msg string) bool {
	jc := sl.base.WithEndpoint(job.Endpoint).WithToken(job.Token)
	log := sl.log.WithValues("job", job.ID, "reason", string(reason))
	text := []byte("+++ buildkite-operator could not run this job\n" + FailurePrefix + msg + "\n")
	if limit := job.ChunksMaxSizeBytes; limit > 0 && uint64(len(text)) > limit {
		text = text[:limit]
	}
	// The explanation opens the log of a job that never ran. A job whose BuildJob went away
	// (or was let go of) may have run and sent output: the explanation then goes past any
	// log a job can have (Buildkite keeps at most 1 GiB), so that it cannot take the place
	// of a chunk.
	seq, offset := uint64(1), uint64(0)
	if reason.mayHaveRun() {
		seq, offset = 1<<30, 1<<40
	}
	for {
		// A resumed failure may have finished before the restart: never finish twice. A job
		// that is canceling or timing out is not over: Buildkite waits for its finish.
		state, err := jc.JobState(ctx, job.ID)
		switch {
		case err == nil && state.Terminal():
			log.Info("job already over in Buildkite", "state", state)
			return sl.failed(reason)
		case agentapi.IsUnauthorized(err):
			log.Info("the job token is no longer valid: the job is over in Buildkite")
			return sl.failed(reason)
		}
		err = jc.Start(ctx, job.ID, time.Now())
		if err == nil || agentapi.IsPermanent(err) {
			chunksFailed := 0
			if err := jc.UploadChunk(ctx, job.ID, seq, offset, text); err != nil {
				chunksFailed = 1
				log.Error(err, "cannot write the explanation into the job's log")
			}
			err = jc.Finish(ctx, job.ID, agentapi.Finish{ExitStatus: -1, SignalReason: reason.signalReason(), ChunksFailedCount: chunksFailed})
			if err == nil || agentapi.IsPermanent(err) {
				log.Info("job failed at intake", "message", msg)
				return sl.failed(reason)
			}
		}
		if ctx.Err() != nil {
			return false
		}
		log.Error(err, "cannot fail the job in Buildkite; retrying")
		if !sleep(ctx, registerRetry) {
			return false
		}
	}
}

// failed counts a job failed at intake; it returns true, the job being over for the slot.
func (sl *slot) failed(reason IntakeFailure) bool {
	intakeFailuresMetric.WithLabelValues(sl.s.cfg.Name, string(reason)).Inc()
	return true
}
