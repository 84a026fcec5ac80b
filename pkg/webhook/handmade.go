package webhook

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// handMadeErrors checks a BuildJob that someone other than the operator creates: its pod
// gets what its environment gives, so its maker must be able to get each Secret the
// environment's pods get and to create tokens of the service account they run as. The
// environment's allowedPipelines cannot stand in for this: they keep pipelines out, but the
// pipeline slug of a BuildJob made by hand is whatever its maker typed, so any maker could
// name a pipeline the environment allows and run with its Secrets and service account.
// The spawner's BuildJobs are the operator's own, for the pipelines Buildkite names, and
// are not checked here. env is the environment job names (the one Admission.Check read),
// nil when there is none: a missing environment is Check's to report.
func (v *buildJobValidator) handMadeErrors(ctx context.Context, job *bkv1.BuildJob, env *bkv1.BuildEnvironment) (field.ErrorList, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("no admission request to learn who creates BuildJob %s: %w", job.Name, err)
	}
	user := req.UserInfo
	operator, err := v.operator.is(ctx, user)
	if err != nil || operator || env == nil {
		return nil, err
	}

	var denied []string
	for _, name := range validation.EnvironmentSecrets(env) {
		ok, err := mayGetSecret(ctx, v.writer, user, job.Namespace, name)
		if err != nil {
			return nil, err
		}
		if !ok {
			denied = append(denied, fmt.Sprintf("get Secret %q", name))
		}
	}
	if sa := runsAs(env); sa != "" {
		ok, err := mayActAs(ctx, v.writer, user, job.Namespace, sa)
		if err != nil {
			return nil, err
		}
		if !ok {
			denied = append(denied, fmt.Sprintf("create tokens of service account %q", sa))
		}
	}
	if len(denied) == 0 {
		return nil, nil
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec", "buildEnvironment"), fmt.Sprintf(
		"%q may not %s, which BuildEnvironment %q gives its pods: a BuildJob made by hand names its own pipeline, so the environment's allowedPipelines cannot keep it out, and its pod would have them for you; choose an environment without them, or ask for that access",
		user.Username, strings.Join(denied, ", nor "), env.Name))}, nil
}
