package spawner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/seal"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// creator makes the Kubernetes objects of an accepted job: its BuildJob and the Secret
// holding its job token. It checks the BuildJob as the admission webhooks would first, so
// that a job that cannot run is explained in its own log. It is shared by all slots.
type creator struct {
	c client.Client
	r client.Reader // reads past the cache
	// admission defaults and checks a BuildJob as the admission webhooks do, reading
	// BuildEnvironments from the cache first (validation.CacheFirst).
	admission validation.Admission
	// namespace of the BuildJobs.
	namespace string
	// timeout bounds the whole of one job's creation (Config.CreateTimeout).
	timeout time.Duration
	reach   *kubeReach
	log     logr.Logger
	// spawner is the spawner's name, as the metrics label it.
	spawner string
	// seal is the operator's seal key, for the token Secrets.
	seal *seal.Source
}

// create makes the job's BuildJob and sealed token Secret and returns the BuildJob's
// name. nonce is the intake's (slotState.Intake). It may be called again for the same job
// (after a restart): a BuildJob this intake made is adopted as it is, neither checked
// again nor made anew, and only its Secret is made if it is missing. A BuildJob of the
// job's name that the intake did not make is left alone, and the job gets its BuildJob
// under its other name (buildJobNames). fresh: the nonce was drawn by this process for
// this job, so no earlier life made a BuildJob with it, and the BuildJob is created under
// the job's own name without a look first (one read less per job); should someone else
// have taken that name, the look is made then. The error is an *intakeError written for
// the pipeline author, or ctx's error when ctx ended.
func (cr *creator) create(ctx context.Context, job *api.Job, nonce string, fresh bool) (string, error) {
	acceptedAt := metav1.Now()
	// When the API server has already been unreachable for a while (the slot waited for it
	// to save), what is left of the timeout, and at least one try.
	cctx, cancel := context.WithTimeout(ctx, max(cr.timeout-cr.reach.downFor(), time.Second))
	defer cancel()
	if _, err := cr.sealKey(cctx); err != nil {
		return "", cr.unavailable(ctx, "load the operator's seal key", err)
	}
	if fresh {
		name, err := cr.make(ctx, cctx, job, buildJobNames(job.ID, nonce)[0], nonce, acceptedAt)
		var taken errNameTaken
		if !errors.As(err, &taken) {
			return name, err
		}
	}
	own, name, err := cr.lookUp(ctx, cctx, job.ID, nonce)
	switch {
	case err != nil:
		return "", err
	case own != nil:
		return cr.complete(ctx, cctx, job, own, adoptedEnv(job, own), false)
	}
	name, err = cr.make(ctx, cctx, job, name, nonce, acceptedAt)
	var taken errNameTaken
	if errors.As(err, &taken) {
		return "", &intakeError{IntakeRejected, fmt.Sprintf(
			"a BuildJob named %s was made by someone other than the operator as the operator made the job's own. Retry the job.", taken.name)}
	}
	return name, err
}

// make creates the job's BuildJob under name, and its token Secret, and returns the
// BuildJob's name. errNameTaken: someone other than this intake has a BuildJob of that
// name. The error is create's.
func (cr *creator) make(ctx, cctx context.Context, job *api.Job, name, nonce string, acceptedAt metav1.Time) (string, error) {
	bj, jobEnv, err := cr.prepare(ctx, cctx, job, name, nonce, acceptedAt)
	if err != nil {
		return "", err
	}
	cur, created, err := cr.createBuildJob(ctx, cctx, bj, nonce)
	if err != nil {
		return "", err
	}
	return cr.complete(ctx, cctx, job, cur, jobEnv, created)
}

// errNameTaken: a BuildJob of the name was made by someone other than the intake.
type errNameTaken struct{ name string }

func (e errNameTaken) Error() string {
	return fmt.Sprintf("BuildJob %s was made by someone other than the operator", e.name)
}

// lookUp finds the BuildJob an earlier life of the slot made for the job (own), which may
// have died before it could record so: its pod may be running, whatever has changed
// since. Else name is the name to make the job's BuildJob under. cctx bounds the reads,
// ctx is the slot's; the error is create's.
func (cr *creator) lookUp(ctx, cctx context.Context, jobID, nonce string) (own *v1alpha1.BuildJob, name string, err error) {
	err = retryKube(cctx, func() (err error) {
		own, name, err = cr.find(cctx, jobID, nonce)
		return err
	})
	switch {
	case err != nil:
		return nil, "", cr.unavailable(ctx, "look up the job's BuildJob", err)
	case own == nil && name == "":
		return nil, "", &intakeError{IntakeRejected, fmt.Sprintf(
			"BuildJobs named %s, made by someone other than the operator, are in the way of the job's own. "+
				"Retry the job; a cluster operator can find who made them in the BuildJobs' managedFields or the audit log.",
			strings.Join(buildJobNames(jobID, nonce), " and "))}
	}
	return own, name, nil
}

// prepare is the job's BuildJob, named name, as it is to be created: mapped from the job,
// defaulted and checked as the admission webhooks will (admit), marked as this intake's,
// accepted at acceptedAt, held by the controller's finalizer, and without the job's env,
// which it returns as env for the token Secret (moveEnvToSecret). The error is create's.
func (cr *creator) prepare(ctx, cctx context.Context, job *api.Job, name, nonce string, acceptedAt metav1.Time) (bj *v1alpha1.BuildJob, env map[string]string, err error) {
	bj, err = buildJobFor(job, cr.namespace, job.Endpoint)
	if err != nil {
		return nil, nil, err
	}
	if note := messageTruncation(job.Env); note != "" {
		// The agent says so in its own log; the job sees the marker in the value.
		cr.log.Info(note, "job", job.ID)
	}
	bj.Name = name
	bj.Spec.TokenSecretRef.Name = v1alpha1.TokenSecretName(name, nonce)
	if bj, err = cr.admit(ctx, cctx, bj); err != nil {
		return nil, nil, err
	}
	if env, err = moveEnvToSecret(bj); err != nil {
		return nil, nil, err
	}
	if bj.Annotations == nil {
		bj.Annotations = map[string]string{}
	}
	bj.Annotations[v1alpha1.AnnotationAcceptedAt] = acceptedAt.UTC().Format(time.RFC3339Nano)
	if nonce != "" {
		bj.Annotations[v1alpha1.AnnotationIntake] = nonce
	}
	// The controller's hold until Buildkite is told how the job ended, there from the
	// start: the controller's first reconcile need not write the BuildJob to add it.
	controllerutil.AddFinalizer(bj, v1alpha1.FinishFinalizer)
	return bj, env, nil
}

// admit defaults and checks bj as the admission webhooks will (validation.Admission),
// reading its environment once, and returns it defaulted. A BuildJob they would refuse is
// an *intakeError for the pipeline author: what to fix, without Kubernetes field paths.
func (cr *creator) admit(ctx, cctx context.Context, bj *v1alpha1.BuildJob) (*v1alpha1.BuildJob, error) {
	var (
		admitted *v1alpha1.BuildJob
		verdict  validation.Verdict
	)
	err := retryKube(cctx, func() (err error) {
		// Every try from the BuildJob as mapped: a failed one may have defaulted part of it.
		admitted = bj.DeepCopy()
		verdict, err = cr.admission.Admit(cctx, admitted)
		return err
	})
	if err != nil {
		return nil, cr.unavailable(ctx, "check the job's BuildJob", err)
	}
	if len(verdict.Problems) > 0 {
		lines := validation.ForPipelineAuthors(verdict.Problems)
		for i := range lines {
			lines[i] = "- " + lines[i]
		}
		return nil, &intakeError{IntakeInvalidBuildJob, "its BuildJob would be invalid:\n" + strings.Join(lines, "\n") +
			"\nFix the step (its buildkite-operator options, env or timeout) in the pipeline, or ask a cluster operator about the BuildEnvironment, then retry the job."}
	}
	return admitted, nil
}

// createBuildJob creates bj and returns it as stored, and whether this call made it. One
// that is there already is read: made by an earlier try of this intake it is the job's
// (created false); made by someone racing the intake, the job is refused. The error is
// create's.
func (cr *creator) createBuildJob(ctx, cctx context.Context, bj *v1alpha1.BuildJob, nonce string) (cur *v1alpha1.BuildJob, created bool, err error) {
	cur, created = &v1alpha1.BuildJob{}, true
	err = retryKube(cctx, func() error {
		// The create answers with the object as stored: no read after it.
		made := bj.DeepCopy()
		err := cr.c.Create(cctx, made)
		if apierrors.IsAlreadyExists(err) {
			created = false // an earlier attempt made it, or someone else just did
			return nil
		}
		if err == nil {
			cur = made
		}
		return err
	})
	if err != nil {
		if isPermanent(err) {
			return nil, false, &intakeError{IntakeRejected, fmt.Sprintf(
				"the Kubernetes API server refused its BuildJob:\n%v\nFix the step in the pipeline as the message says (or ask a cluster operator about the admission policy), then retry the job.", err)}
		}
		return nil, false, cr.unavailable(ctx, "create the job's BuildJob", err)
	}
	if created {
		return cur, true, nil
	}
	if err := retryKube(cctx, func() error { return cr.r.Get(cctx, client.ObjectKeyFromObject(bj), cur) }); err != nil {
		return nil, false, cr.unavailable(ctx, "read the job's BuildJob", err)
	}
	if !madeBy(cur, nonce) {
		// Made before the create (a fresh intake did not look), or between the look and
		// the create by someone racing the intake.
		cr.ignore(cur)
		return nil, false, errNameTaken{cur.Name}
	}
	return cur, false, nil
}

// find looks, past the cache, at the names the intake with this nonce gives job jobID's
// BuildJob (buildJobNames), in order: own is the BuildJob the intake made, if any; else
// free is the first name nobody has taken ("" when someone else has them all). A BuildJob
// the intake did not make is passed over, and said so in the log. One read a name, no
// retries: the caller bounds them.
func (cr *creator) find(ctx context.Context, jobID, nonce string) (own *v1alpha1.BuildJob, free string, err error) {
	for _, name := range buildJobNames(jobID, nonce) {
		var bj v1alpha1.BuildJob
		err := cr.r.Get(ctx, client.ObjectKey{Namespace: cr.namespace, Name: name}, &bj)
		switch {
		case apierrors.IsNotFound(err):
			return nil, name, nil
		case err != nil:
			return nil, "", fmt.Errorf("reading BuildJob %s: %w", name, err)
		case madeBy(&bj, nonce):
			return &bj, "", nil
		}
		cr.ignore(&bj)
	}
	return nil, "", nil
}

// madeBy reports whether bj is the BuildJob of the intake with this nonce. A BuildJob
// of the state of an operator from before nonces (nonce empty) is taken as it was then,
// by its name alone; complete then checks its Secret.
func madeBy(bj *v1alpha1.BuildJob, nonce string) bool {
	if nonce == "" {
		return bj.Annotations[v1alpha1.AnnotationIntake] == ""
	}
	return bj.Annotations[v1alpha1.AnnotationIntake] == nonce
}

// ignore says, in the operator's log, that a BuildJob named as a job's was not made by
// the operator and gets nothing of the job.
func (cr *creator) ignore(bj *v1alpha1.BuildJob) {
	cr.log.Info("a BuildJob named after the job was not made by the operator: it gets neither the job nor its token",
		"buildjob", bj.Name, "job", bj.Spec.JobID)
}

// sealKey is the operator's seal key, loaded with retries.
func (cr *creator) sealKey(ctx context.Context) (*seal.Key, error) {
	var key *seal.Key
	err := retryKube(ctx, func() (err error) {
		key, err = cr.seal.Key(ctx)
		return err
	})
	return key, err
}

// unavailable is the error of a job whose creation could not reach the API server, or
// ctx's error when ctx ended.
func (cr *creator) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	cr.reach.failed(err)
	return &intakeError{IntakeAPIUnavailable, fmt.Sprintf(
		"the Kubernetes API server could not be reached for %s to %s (%v). The job was not run; retry it once the operator's cluster is healthy.",
		cr.timeout, what, err)}
}

// complete makes the Secret of the BuildJob cur, with the job token and the values of
// env that cur lists. created says this call made cur; cctx bounds the calls, ctx is the
// slot's.
func (cr *creator) complete(ctx, cctx context.Context, job *api.Job, cur *v1alpha1.BuildJob, env map[string]string, created bool) (string, error) {
	if err := cr.createTokenSecret(cctx, cur, job.Token, env); err != nil {
		if ctx.Err() != nil {
			// The spawner is stopping: the slot still holds the job, and the next spawner
			// adopts this BuildJob and makes its Secret. Taking it back here would leave
			// it being deleted, which the controller reads as a cancel.
			return "", ctx.Err()
		}
		// A BuildJob without its token cannot be run or reported: take it back.
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
		if derr := cr.c.Delete(dctx, cur); derr != nil && !apierrors.IsNotFound(derr) {
			cr.log.Error(derr, "cannot delete the BuildJob whose token Secret failed", "buildjob", cur.Name)
		}
		dcancel()
		var foreign errForeignSecret
		if errors.As(err, &foreign) {
			return "", &intakeError{IntakeRejected, foreign.Error() + ", so the job's token was not written there and the job cannot run. " +
				"Retry the job; a cluster operator can find who made the Secret in its managedFields or the audit log."}
		}
		if isPermanent(err) {
			return "", &intakeError{IntakeRejected, fmt.Sprintf("the Kubernetes API server refused the Secret holding its job token and env: %v; "+
				"if the step's env is larger than a Secret may hold (1 MiB), make it smaller; else ask a cluster operator to check the job namespace's quota and admission policy; then retry the job.", err)}
		}
		return "", cr.unavailable(ctx, "create the Secret holding its job token and env", err)
	}
	if created {
		if t, err := time.Parse(time.RFC3339Nano, job.RunnableAt); err == nil {
			runnableToBuildJobMetric.WithLabelValues(cr.spawner).Observe(time.Since(t).Seconds())
		}
	}

	cr.log.Info("BuildJob created", "buildjob", cur.Name, "pipeline", cur.Spec.PipelineSlug, "build", cur.Spec.BuildNumber, "created", created)
	cr.reach.ok()
	return cur.Name, nil
}
