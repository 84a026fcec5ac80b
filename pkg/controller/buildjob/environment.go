package buildjob

import (
	"context"

	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// environmentProblem says, for the pipeline's author, why the job cannot run in its
// environment (which may not exist), with the environments the pipeline may use and the
// nearest name: the same words the spawner writes at intake. "" when the job may use it.
func (r *Reconciler) environmentProblem(ctx context.Context, s *scope) (string, error) {
	env, err := s.environment(ctx)
	if err != nil {
		return "", err
	}
	job := s.job
	if env != nil && validation.PipelineAllowed(env, job.Spec.PipelineSlug) {
		return "", nil
	}
	available, err := validation.ListEnvironments(ctx, r.client, job.Namespace)
	if err != nil {
		return "", err
	}
	return validation.EnvironmentProblem(job.Spec.PipelineSlug, s.envName(), env, available), nil
}
