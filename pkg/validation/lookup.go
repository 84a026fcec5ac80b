package validation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// CheckBuildJob looks up what BuildJob needs (the job's environment, its namespace's
// LimitRanges and, when the environment cannot be used, the namespace's environments) with r and runs it, so the webhook and the spawner share one code path.
// The error is for a failed lookup only; problems with the job are in the ErrorList.
// Pass an uncached reader (the manager's APIReader) where a just-created environment
// must be seen.
func CheckBuildJob(ctx context.Context, r client.Reader, job *bkv1.BuildJob) (field.ErrorList, []string, error) {
	env, err := GetEnvironment(ctx, r, job.Namespace, job.Spec.BuildEnvironment)
	if err != nil {
		return nil, nil, err
	}
	var limits corev1.LimitRangeList
	if err := r.List(ctx, &limits, client.InNamespace(job.Namespace)); err != nil {
		return nil, nil, fmt.Errorf("listing LimitRanges in namespace %q: %w", job.Namespace, err)
	}
	// The namespace's environments are listed only for the message of a job that cannot
	// use its own: an extra request on the path that fails anyway.
	var available []bkv1.BuildEnvironment
	if job.Spec.BuildEnvironment == "" || env == nil || !PipelineAllowed(env, job.Spec.PipelineSlug) {
		if available, err = ListEnvironments(ctx, r, job.Namespace); err != nil {
			return nil, nil, err
		}
	}
	errs, warnings := BuildJob(job, env, limits.Items, available)
	return errs, warnings, nil
}

// DefaultBuildJob looks up the job's environment (after choosing defaultEnvironment when
// the job names none) and applies ApplyDefaults.
func DefaultBuildJob(ctx context.Context, r client.Reader, job *bkv1.BuildJob, defaultEnvironment string) error {
	env, err := GetEnvironment(ctx, r, job.Namespace, EnvironmentName(job, defaultEnvironment))
	if err != nil {
		return err
	}
	ApplyDefaults(job, defaultEnvironment, env)
	return nil
}

// GetEnvironment returns the named BuildEnvironment, or nil when name is empty or no
// such environment exists.
func GetEnvironment(ctx context.Context, r client.Reader, namespace, name string) (*bkv1.BuildEnvironment, error) {
	if name == "" {
		return nil, nil
	}
	var env bkv1.BuildEnvironment
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &env)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting BuildEnvironment %s/%s: %w", namespace, name, err)
	}
	return &env, nil
}
