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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// FailurePrefix starts the explanation written into the log of a job the operator could
// not run.
const FailurePrefix = "buildkite-operator could not run this job: "

// intake turns the slot's job into a BuildJob, or fails it in Buildkite, then waits
// until the job is over for the slot. It returns false when ctx ended first; the slot's
// Secret then still holds the job for the next instance.
func (s *Spawner) intake(ctx context.Context, sl *slot, job *api.Job) bool {
	if sl.state.Failing == "" {
		name, err := s.makeBuildJob(ctx, job)
		if err == nil {
			s.reach.ok()
			return s.waitReported(ctx, sl, name)
		}
		if ctx.Err() != nil {
			return false
		}
		var ie *intakeError
		if !errors.As(err, &ie) {
			ie = &intakeError{ReasonUnavailable, err.Error()}
		}
		// Decided once: a resumed slot keeps failing the job with the same words rather
		// than trying again and perhaps running a job whose log already has them.
		sl.state.Failing = ie.reason + "\n" + ie.msg
		if !sl.save(ctx) {
			return false
		}
	}
	reason, msg, _ := strings.Cut(sl.state.Failing, "\n")
	return s.failJob(ctx, sl, job, reason, msg)
}

// makeBuildJob creates the job's BuildJob and token Secret, after the checks the
// admission webhooks make, so that a job that cannot run is explained in its own log.
func (s *Spawner) makeBuildJob(ctx context.Context, job *api.Job) (string, error) {
	acceptedAt := metav1.Now()
	// When the API server has already been unreachable for a while (the slot waited for it
	// to save), what is left of CreateTimeout, and at least one try.
	cctx, cancel := context.WithTimeout(ctx, max(s.cfg.CreateTimeout-s.reach.downFor(), time.Second))
	defer cancel()
	bj, err := buildJobFor(job, s.cfg.Namespace, job.Endpoint)
	if err != nil {
		return "", err
	}
	unavailable := func(what string, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.reach.failed(err)
		return &intakeError{ReasonUnavailable, fmt.Sprintf(
			"the Kubernetes API server could not be reached for %s to %s (%v). The job was not run; retry it once the operator's cluster is healthy.",
			s.cfg.CreateTimeout, what, err)}
	}

	var env *v1alpha1.BuildEnvironment
	err = retryKube(cctx, func() (err error) {
		env, err = validation.GetEnvironment(cctx, s.r, s.cfg.Namespace, validation.EnvironmentName(bj, s.cfg.DefaultBuildEnvironment))
		return err
	})
	if err != nil {
		return "", unavailable("look up the job's BuildEnvironment", err)
	}
	validation.ApplyDefaults(bj, s.cfg.DefaultBuildEnvironment, env)
	var problems field.ErrorList
	err = retryKube(cctx, func() (err error) {
		problems, _, err = validation.CheckBuildJob(cctx, s.r, bj)
		return err
	})
	if err != nil {
		return "", unavailable("check the job's BuildJob", err)
	}
	if len(problems) > 0 {
		lines := make([]string, len(problems))
		for i, p := range problems {
			lines[i] = "- " + p.Error()
		}
		return "", &intakeError{ReasonInvalidSpec, "its BuildJob would be invalid:\n" + strings.Join(lines, "\n") +
			"\nFix the step (its buildkite-operator options, env or timeout) in the pipeline, or ask a cluster operator about the BuildEnvironment, then retry the job."}
	}

	created := true
	err = retryKube(cctx, func() error {
		err := s.c.Create(cctx, bj.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			created = false // an earlier attempt (or life) made it: the name is the job's
			return nil
		}
		return err
	})
	if err != nil {
		if isPermanent(err) {
			return "", &intakeError{ReasonRejected, fmt.Sprintf(
				"the Kubernetes API server refused its BuildJob:\n%v\nFix the step in the pipeline as the message says (or ask a cluster operator about the admission policy), then retry the job.", err)}
		}
		return "", unavailable("create the job's BuildJob", err)
	}
	var cur v1alpha1.BuildJob
	err = retryKube(cctx, func() error { return s.r.Get(cctx, client.ObjectKeyFromObject(bj), &cur) })
	if err != nil {
		return "", unavailable("read the job's BuildJob", err)
	}

	if err := s.createTokenSecret(cctx, &cur, job.Token); err != nil {
		// A BuildJob without its token cannot be run or reported: take it back.
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		if derr := s.c.Delete(dctx, &cur); derr != nil && !apierrors.IsNotFound(derr) {
			s.log.Error(derr, "cannot delete the BuildJob whose token Secret failed", "buildjob", cur.Name)
		}
		dcancel()
		if isPermanent(err) {
			return "", &intakeError{ReasonRejected, fmt.Sprintf("the Kubernetes API server refused the Secret holding its job token: %v; ask a cluster operator to check the operator's namespace and admission policy, then retry the job.", err)}
		}
		return "", unavailable("create the Secret holding its job token", err)
	}
	if created {
		if t, err := time.Parse(time.RFC3339Nano, job.RunnableAt); err == nil {
			runnableToBuildJobMetric.WithLabelValues(s.cfg.Name).Observe(time.Since(t).Seconds())
		}
	}

	err = retryKube(cctx, func() error {
		var bj v1alpha1.BuildJob
		if err := s.r.Get(cctx, client.ObjectKeyFromObject(&cur), &bj); err != nil {
			return err
		}
		if bj.Status.Times.AcceptedAt != nil {
			return nil
		}
		bj.Status.Times.AcceptedAt = &acceptedAt
		err := s.c.Status().Update(cctx, &bj)
		if apierrors.IsConflict(err) {
			return retryable{err}
		}
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) {
		// Only a record: the BuildJob runs without it.
		s.log.Error(err, "cannot record when the job was accepted", "buildjob", cur.Name)
	}
	s.log.Info("BuildJob created", "buildjob", cur.Name, "pipeline", cur.Spec.PipelineSlug, "build", cur.Spec.BuildNumber, "created", created)
	return cur.Name, nil
}

func (s *Spawner) createTokenSecret(ctx context.Context, owner *v1alpha1.BuildJob, token string) error {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      owner.Spec.TokenSecretRef.Name,
			Namespace: owner.Namespace,
			Labels:    map[string]string{v1alpha1.LabelJob: owner.Labels[v1alpha1.LabelJob]},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{owner.Spec.TokenSecretRef.Key: []byte(token)},
	}
	if owner.Labels[v1alpha1.LabelJob] == "" {
		sec.Labels = nil
	}
	if err := controllerutil.SetControllerReference(owner, sec, s.c.Scheme()); err != nil {
		return fmt.Errorf("owning the token Secret by its BuildJob: %w", err)
	}
	return retryKube(ctx, func() error {
		err := s.c.Create(ctx, sec.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
}

// waitReported keeps the slot busy, heartbeating, until its BuildJob is reported to
// Buildkite or gone. It returns false when ctx ended first.
func (s *Spawner) waitReported(ctx context.Context, sl *slot, name string) bool {
	wake, remove := s.addWaiter(name)
	defer remove()
	for {
		done, err := s.reported(ctx, name)
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
func (s *Spawner) failJob(ctx context.Context, sl *slot, job *api.Job, reason, msg string) bool {
	jc := sl.base.WithEndpoint(job.Endpoint).WithToken(job.Token)
	log := sl.log.WithValues("job", job.ID, "reason", reason)
	text := []byte("+++ buildkite-operator could not run this job\n" + FailurePrefix + msg + "\n")
	if limit := job.ChunksMaxSizeBytes; limit > 0 && uint64(len(text)) > limit {
		text = text[:limit]
	}
	for {
		// A resumed failure may have finished before the restart: never finish twice.
		state, err := jc.JobState(ctx, job.ID)
		switch {
		case err == nil && (state.Terminal() || state.Ending()):
			log.Info("job already over in Buildkite", "state", state)
			return s.failed(reason)
		case agentapi.IsUnauthorized(err):
			log.Info("the job token is no longer valid: the job is over in Buildkite")
			return s.failed(reason)
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
				return s.failed(reason)
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

func (s *Spawner) failed(reason string) bool {
	intakeFailuresMetric.WithLabelValues(s.cfg.Name, reason).Inc()
	return true
}

// retryable marks an error worth retrying that isPermanent would call permanent.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

// isPermanent reports an API server answer that retrying will not change: a refusal
// (invalid, forbidden, a webhook's denial). Anything else (timeouts, 5xx, 429, failures
// to reach it) is worth retrying.
func isPermanent(err error) bool {
	var r retryable
	if errors.As(err, &r) {
		return false
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	switch {
	case apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err):
		return false
	}
	return st.Status().Code >= 400 && st.Status().Code < 500
}

// retryKube calls f until it succeeds, fails permanently or ctx ends; then it returns
// the last error.
func retryKube(ctx context.Context, f func() error) error {
	wait := 200 * time.Millisecond
	for {
		err := f()
		if err == nil || isPermanent(err) {
			return err
		}
		if !sleep(ctx, wait) {
			return err
		}
		wait = min(wait*2, 10*time.Second)
	}
}
