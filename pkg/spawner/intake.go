package spawner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/buildkite/agent/v3/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
			name, err := sl.s.creator.create(ctx, job)
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
		over, gone := sl.waitReported(ctx, sl.state.BuildJob)
		if !over {
			return false
		}
		if !gone {
			return true
		}
		// Deleted without a report (its finalizer removed by hand, or a BuildJob lost with
		// its cluster): nobody else will finish the job. Should Buildkite have it finished
		// already (reported while this slot was not looking), failJob sees so and stops.
		return sl.decideFailure(ctx, job, &intakeError{IntakeBuildJobGone, fmt.Sprintf(
			"its BuildJob %s was deleted before the job's end was reported to Buildkite, so how the job ended is unknown. "+
				"Retry the job; a cluster operator can tell from the operator's events and logs why the BuildJob went away.",
			sl.state.BuildJob)})
	}
	reason, msg := sl.state.failure()
	return sl.failJob(ctx, job, reason, msg)
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
// Buildkite or gone. over is false when ctx ended first; gone says the BuildJob no longer
// exists, and was not seen reported.
func (sl *slot) waitReported(ctx context.Context, name string) (over, gone bool) {
	wake, remove := sl.s.addWaiter(name)
	defer remove()
	for {
		st, err := sl.s.reported(ctx, name)
		if ctx.Err() != nil {
			return false, false
		}
		switch {
		case err != nil:
			sl.log.Error(err, "cannot read the job's BuildJob", "buildjob", name)
		case st == buildJobReported:
			return true, false
		case st == buildJobGone:
			sl.log.Info("the job's BuildJob was deleted before it was reported", "buildjob", name)
			return true, true
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

// findBuildJob reads the BuildJob name from the API server, where the creator makes
// BuildJobs, and the job token from its Secret: nil when the BuildJob does not exist, ""
// when its token does not.
func (s *Spawner) findBuildJob(ctx context.Context, name string) (*v1alpha1.BuildJob, string, error) {
	ns := s.creator.namespace
	var bj v1alpha1.BuildJob
	err := s.r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &bj)
	switch {
	case apierrors.IsNotFound(err):
		return nil, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("reading BuildJob %s: %w", name, err)
	}
	var sec corev1.Secret
	ref := bj.Spec.TokenSecretRef
	err = s.r.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &sec)
	switch {
	case apierrors.IsNotFound(err):
		return &bj, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("reading the token Secret of BuildJob %s: %w", name, err)
	}
	return &bj, string(sec.Data[ref.KeyOrDefault()]), nil
}

// buildJobState is where a slot's BuildJob is, as far as the slot cares.
type buildJobState int

const (
	buildJobPending  buildJobState = iota // not yet reported
	buildJobReported                      // status.times.reportedAt is set
	buildJobGone                          // deleted
)

// reported tells whether the BuildJob is reported to Buildkite or gone. It reads the
// cache, but believes a NotFound only from the API server: a BuildJob just created may
// not be in the cache yet.
func (s *Spawner) reported(ctx context.Context, name string) (buildJobState, error) {
	key := client.ObjectKey{Namespace: s.cfg.JobNamespace, Name: name}
	var bj v1alpha1.BuildJob
	err := s.cfg.Cache.Get(ctx, key, &bj)
	if err != nil {
		err = s.r.Get(ctx, key, &bj)
	}
	switch {
	case apierrors.IsNotFound(err):
		return buildJobGone, nil
	case err != nil:
		return buildJobPending, err
	case bj.Status.Times.ReportedAt != nil:
		return buildJobReported, nil
	}
	return buildJobPending, nil
}

// failJob ends a job that cannot run (or whose BuildJob is gone) as Buildkite expects of
// an agent that refuses one: start it, explain in its log, finish it with -1/stack_error. It returns false when
// ctx ended first.
func (sl *slot) failJob(ctx context.Context, job *api.Job, reason IntakeFailure, msg string) bool {
	jc := sl.base.WithEndpoint(job.Endpoint).WithToken(job.Token)
	log := sl.log.WithValues("job", job.ID, "reason", string(reason))
	text := []byte("+++ buildkite-operator could not run this job\n" + FailurePrefix + msg + "\n")
	if limit := job.ChunksMaxSizeBytes; limit > 0 && uint64(len(text)) > limit {
		text = text[:limit]
	}
	// The explanation opens the log of a job that never ran. A job whose BuildJob went away
	// may have run and sent output: the explanation then goes past any log a job can have
	// (Buildkite keeps at most 1 GiB), so that it cannot take the place of a chunk.
	seq, offset := uint64(1), uint64(0)
	if reason == IntakeBuildJobGone {
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
			err = jc.Finish(ctx, job.ID, agentapi.Finish{ExitStatus: -1, SignalReason: agentapi.SignalReasonStackError, ChunksFailedCount: chunksFailed})
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
