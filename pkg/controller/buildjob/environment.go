package buildjob

import (
	"context"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// environmentProblem says, for the pipeline's author, why job cannot run in the environment
// named envName (env: that environment, nil when it does not exist), with the
// environments the pipeline may use and the nearest name: the same words the spawner
// writes at intake. "" when the job may use env.
func (r *Reconciler) environmentProblem(ctx context.Context, job *bkv1.BuildJob, envName string, env *bkv1.BuildEnvironment) (string, error) {
	if env != nil && validation.PipelineAllowed(env, job.Spec.PipelineSlug) {
		return "", nil
	}
	available, err := validation.ListEnvironments(ctx, r.client, job.Namespace)
	if err != nil {
		return "", err
	}
	return validation.EnvironmentProblem(job.Spec.PipelineSlug, envName, env, available), nil
}
