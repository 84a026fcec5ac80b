package spawner

import (
	"context"
	"errors"
	"time"

	"github.com/buildkite/agent/v3/api"
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
func (sl *slot) intake(ctx context.Context, job *api.Job) bool {
	if sl.state.Failing == "" {
		name, err := sl.s.creator.create(ctx, job)
		if err == nil {
			return sl.waitReported(ctx, name)
		}
		if ctx.Err() != nil {
			return false
		}
		var ie *intakeError
		if !errors.As(err, &ie) {
			ie = &intakeError{IntakeAPIUnavailable, err.Error()}
		}
		// Decided once: a resumed slot keeps failing the job with the same words rather
		// than trying again and perhaps running a job whose log already has them.
		sl.state.fail(ie)
		if !sl.save(ctx) {
			return false
		}
	}
	reason, msg := sl.state.failure()
	return sl.failJob(ctx, job, reason, msg)
}

// waitReported keeps the slot busy, heartbeating, until its BuildJob is reported to
// Buildkite or gone. It returns false when ctx ended first.
func (sl *slot) waitReported(ctx context.Context, name string) bool {
	wake, remove := sl.s.addWaiter(name)
	defer remove()
	for {
		done, err := sl.s.reported(ctx, name)
		if ctx.Err() != nil {
			return false
		}
		if err != nil {
			sl.log.Error(err, "cannot read the job's BuildJob", "buildjob", name)
		} else if done {
			return true
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

// reported tells whether the BuildJob is reported to Buildkite or gone. It reads the
// cache, but believes a NotFound only from the API server: a BuildJob just created may
// not be in the cache yet.
func (s *Spawner) reported(ctx context.Context, name string) (bool, error) {
	key := client.ObjectKey{Namespace: s.cfg.Namespace, Name: name}
	var bj v1alpha1.BuildJob
	err := s.cfg.Cache.Get(ctx, key, &bj)
	if err != nil {
		err = s.r.Get(ctx, key, &bj)
	}
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return bj.Status.Times.ReportedAt != nil, nil
}

// failJob ends a job that cannot run as Buildkite expects of an agent that refuses one:
// start it, explain in its log, finish it with -1/stack_error. It returns false when
// ctx ended first.
func (sl *slot) failJob(ctx context.Context, job *api.Job, reason IntakeFailure, msg string) bool {
	jc := sl.base.WithEndpoint(job.Endpoint).WithToken(job.Token)
	log := sl.log.WithValues("job", job.ID, "reason", string(reason))
	text := []byte("+++ buildkite-operator could not run this job\n" + FailurePrefix + msg + "\n")
	if limit := job.ChunksMaxSizeBytes; limit > 0 && uint64(len(text)) > limit {
		text = text[:limit]
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
			if err := jc.UploadChunk(ctx, job.ID, 1, 0, text); err != nil {
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
