package spawner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
	// envs reads BuildEnvironments from the cache first (environmentReader).
	envs client.Reader
	// namespace of the BuildJobs, and the BuildEnvironment of those that name none.
	namespace, defaultEnvironment string
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
// under its other name (buildJobNames). The error is an *intakeError written for the
// pipeline author, or ctx's error when ctx ended.
func (cr *creator) create(ctx context.Context, job *api.Job, nonce string) (string, error) {
	acceptedAt := metav1.Now()
	// When the API server has already been unreachable for a while (the slot waited for it
	// to save), what is left of the timeout, and at least one try.
	cctx, cancel := context.WithTimeout(ctx, max(cr.timeout-cr.reach.downFor(), time.Second))
	defer cancel()
	if _, err := cr.sealKey(cctx); err != nil {
		return "", cr.unavailable(ctx, "load the operator's seal key", err)
	}
	// An earlier life of the slot may have made the BuildJob and died before it could
	// record so: its pod may be running, whatever has changed since.
	var own *v1alpha1.BuildJob
	name := ""
	err := retryKube(cctx, func() (err error) {
		own, name, err = cr.find(cctx, job.ID, nonce)
		return err
	})
	switch {
	case err != nil:
		return "", cr.unavailable(ctx, "look up the job's BuildJob", err)
	case own != nil:
		return cr.complete(ctx, cctx, job, own, adoptedEnv(job, own), false)
	case name == "":
		return "", &intakeError{IntakeRejected, fmt.Sprintf(
			"BuildJobs named %s, made by someone other than the operator, are in the way of the job's own. "+
				"Retry the job; a cluster operator can find who made them in the BuildJobs' managedFields or the audit log.",
			strings.Join(buildJobNames(job.ID, nonce), " and "))}
	}

	bj, err := buildJobFor(job, cr.namespace, job.Endpoint)
	if err != nil {
		return "", err
	}
	if note := messageTruncation(job.Env); note != "" {
		// The agent says so in its own log; the job sees the marker in the value.
		cr.log.Info(note, "job", job.ID)
	}
	bj.Name = name
	bj.Spec.TokenSecretRef.Name = v1alpha1.TokenSecretName(name, nonce)
	var env *v1alpha1.BuildEnvironment
	err = retryKube(cctx, func() (err error) {
		env, err = validation.GetEnvironment(cctx, cr.envs, cr.namespace, validation.EnvironmentName(bj, cr.defaultEnvironment))
		return err
	})
	if err != nil {
		return "", cr.unavailable(ctx, "look up the job's BuildEnvironment", err)
	}
	validation.ApplyDefaults(bj, cr.defaultEnvironment, env)
	var problems field.ErrorList
	err = retryKube(cctx, func() (err error) {
		problems, _, err = validation.CheckBuildJob(cctx, cr.envs, bj)
		return err
	})
	if err != nil {
		return "", cr.unavailable(ctx, "check the job's BuildJob", err)
	}
	if len(problems) > 0 {
		// Written for the pipeline author: what to fix, without Kubernetes field paths.
		lines := validation.ForPipelineAuthors(problems)
		for i := range lines {
			lines[i] = "- " + lines[i]
		}
		return "", &intakeError{IntakeInvalidBuildJob, "its BuildJob would be invalid:\n" + strings.Join(lines, "\n") +
			"\nFix the step (its buildkite-operator options, env or timeout) in the pipeline, or ask a cluster operator about the BuildEnvironment, then retry the job."}
	}
	jobEnv, err := moveEnvToSecret(bj)
	if err != nil {
		return "", err
	}

	if bj.Annotations == nil {
		bj.Annotations = map[string]string{}
	}
	bj.Annotations[v1alpha1.AnnotationAcceptedAt] = acceptedAt.UTC().Format(time.RFC3339Nano)
	if nonce != "" {
		bj.Annotations[v1alpha1.AnnotationIntake] = nonce
	}
	var cur v1alpha1.BuildJob
	created := true
	err = retryKube(cctx, func() error {
		// The create answers with the object as stored: no read after it.
		made := bj.DeepCopy()
		err := cr.c.Create(cctx, made)
		if apierrors.IsAlreadyExists(err) {
			created = false // an earlier attempt made it, or someone else just did
			return nil
		}
		if err == nil {
			cur = *made
		}
		return err
	})
	if err != nil {
		if isPermanent(err) {
			return "", &intakeError{IntakeRejected, fmt.Sprintf(
				"the Kubernetes API server refused its BuildJob:\n%v\nFix the step in the pipeline as the message says (or ask a cluster operator about the admission policy), then retry the job.", err)}
		}
		return "", cr.unavailable(ctx, "create the job's BuildJob", err)
	}
	if !created {
		err = retryKube(cctx, func() error { return cr.r.Get(cctx, client.ObjectKeyFromObject(bj), &cur) })
		if err != nil {
			return "", cr.unavailable(ctx, "read the job's BuildJob", err)
		}
		if !madeBy(&cur, nonce) {
			// Made between the look above and the create, by someone racing the intake.
			cr.ignore(&cur)
			return "", &intakeError{IntakeRejected, fmt.Sprintf(
				"a BuildJob named %s was made by someone other than the operator as the operator made the job's own. Retry the job.", cur.Name)}
		}
	}
	return cr.complete(ctx, cctx, job, &cur, jobEnv, created)
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

// environmentReader reads BuildEnvironments from the cache, and from the API server when
// the cache does not have one (it may have been created a moment ago); everything else
// (LimitRanges, which are not watched) from the API server. The intake reads the job's
// environment twice: two round trips to the API server per job, on the pickup's path.
type environmentReader struct {
	cache, api client.Reader
}

func (e environmentReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*v1alpha1.BuildEnvironment); ok && e.cache != nil {
		if err := e.cache.Get(ctx, key, obj, opts...); err == nil {
			return nil
		}
	}
	return e.api.Get(ctx, key, obj, opts...)
}

func (e environmentReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*v1alpha1.BuildEnvironmentList); ok && e.cache != nil {
		if err := e.cache.List(ctx, list, opts...); err == nil {
			return nil
		}
	}
	return e.api.List(ctx, list, opts...)
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

// moveEnvToSecret takes the job's env out of bj's spec, leaving only the names
// (spec.envNames), and returns it for the token Secret. A pipeline's env holds its
// secrets, and a BuildJob or a pod spec may be read by many more people than its Secret.
// The error, an *intakeError, names a variable whose name cannot make a Secret key.
func moveEnvToSecret(bj *v1alpha1.BuildJob) (map[string]string, error) {
	env := bj.Spec.Env
	names := slices.Sorted(maps.Keys(env))
	var problems []string
	for _, n := range names {
		if msgs := k8svalidation.IsConfigMapKey(v1alpha1.EnvSecretKey(n)); len(msgs) > 0 {
			problems = append(problems, fmt.Sprintf("the step's env variable %.80q cannot be kept in a Secret: %s", n, strings.Join(msgs, "; ")))
		}
	}
	if len(problems) > 0 {
		return nil, &intakeError{IntakeInvalidJob, strings.Join(problems, "\n") + "\nRename or shorten the variable in the pipeline, then retry the job."}
	}
	bj.Spec.Env, bj.Spec.EnvNames = nil, names
	if len(names) == 0 {
		bj.Spec.EnvNames = nil
	}
	return env, nil
}

// adoptedEnv is the env of a BuildJob made by an earlier life of the slot, in case its
// Secret is still to be made: the job's env mapped again, as it was then. Should the
// mapping fail now, the Secret holds the token alone, and the pod, missing its env, fails
// to start with an explanation from the controller.
func adoptedEnv(job *api.Job, cur *v1alpha1.BuildJob) map[string]string {
	if len(cur.Spec.EnvNames) == 0 {
		return nil
	}
	bj, err := buildJobFor(job, cur.Namespace, job.Endpoint)
	if err != nil {
		return nil
	}
	return bj.Spec.Env
}

// createTokenSecret makes the BuildJob's Secret: the job token, the value from env of
// each variable the BuildJob lists in spec.envNames, and the seal that tells the
// controller the Secret is the spawner's, made for this BuildJob. A Secret of that name
// that is already there is used only if it is this one (made by an earlier attempt); one
// from before seals, controlled by owner, is sealed now. Any other is someone else's: the
// token is not written there (errForeignSecret).
func (cr *creator) createTokenSecret(ctx context.Context, owner *v1alpha1.BuildJob, token string, env map[string]string) error {
	key, err := cr.sealKey(ctx)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      owner.Spec.TokenSecretRef.Name,
			Namespace: owner.Namespace,
			Labels:    map[string]string{v1alpha1.LabelJob: owner.Labels[v1alpha1.LabelJob]},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			owner.Spec.TokenSecretRef.KeyOrDefault(): []byte(token),
			v1alpha1.TokenSecretSealKey:              []byte(key.BuildJob(owner)),
		},
	}
	for _, n := range owner.Spec.EnvNames {
		if v, ok := env[n]; ok {
			sec.Data[v1alpha1.EnvSecretKey(n)] = []byte(v)
		}
	}
	if owner.Labels[v1alpha1.LabelJob] == "" {
		sec.Labels = nil
	}
	if err := controllerutil.SetControllerReference(owner, sec, cr.c.Scheme()); err != nil {
		return fmt.Errorf("owning the token Secret by its BuildJob: %w", err)
	}
	return retryKube(ctx, func() error {
		err := cr.c.Create(ctx, sec.DeepCopy())
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		var cur corev1.Secret
		if err := cr.r.Get(ctx, client.ObjectKeyFromObject(sec), &cur); err != nil {
			return err
		}
		switch {
		case key.TokenSecret(owner, &cur):
			return nil
		case ownedBy(&cur, owner) && len(cur.Data[v1alpha1.TokenSecretSealKey]) == 0:
			return cr.sealLegacy(ctx, key, owner, &cur)
		}
		return errForeignSecret{sec.Name}
	})
}

// sealLegacy seals the token Secret of a BuildJob made before seals, so that the
// controller, which uses only sealed Secrets, can still report its job.
func (cr *creator) sealLegacy(ctx context.Context, key *seal.Key, owner *v1alpha1.BuildJob, sec *corev1.Secret) error {
	sec = sec.DeepCopy()
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	sec.Data[v1alpha1.TokenSecretSealKey] = []byte(key.BuildJob(owner))
	if err := cr.c.Update(ctx, sec); err != nil {
		return fmt.Errorf("sealing the token Secret %s of BuildJob %s: %w", sec.Name, owner.Name, err)
	}
	return nil
}

// ownedBy reports whether obj is controlled by owner, by UID.
func ownedBy(obj metav1.Object, owner *v1alpha1.BuildJob) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == owner.UID
}

// errForeignSecret: the token Secret's name is taken by a Secret the spawner did not make.
type errForeignSecret struct{ name string }

func (e errForeignSecret) Error() string {
	return fmt.Sprintf("Secret %s, where the job's token goes, was made by someone other than the operator", e.name)
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
	var f errForeignSecret
	if errors.As(err, &f) {
		return true
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
