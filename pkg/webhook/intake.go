package webhook

import (
	"context"
	"fmt"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// jobNameRE matches the names the spawner gives BuildJobs: a Buildkite job's UUID,
// alone or with the intake's nonce after it.
var jobNameRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(-|$)`)

// intakeErrors keeps to the operator what marks a BuildJob as made from a Buildkite job:
// the names the spawner gives (a job's UUID: Buildkite shows the UUIDs of jobs that have
// not run yet, so anyone could make a BuildJob in a waiting job's name beforehand) and
// the intake annotation. The spawner and the controller do not rely on this check (they
// tell their own BuildJobs by the intake's nonce and the token Secret's seal, which hold
// without webhooks); it refuses at once, with a message, what would only be ignored.
//
// It runs on create only, as the rest of the BuildJob webhook: an annotation added later
// to a BuildJob made by hand makes it wait for a sealed token Secret that never comes.
func (v *buildJobValidator) intakeErrors(ctx context.Context, job *bkv1.BuildJob) (field.ErrorList, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("no admission request to learn who writes BuildJob %s: %w", job.Name, err)
	}
	operator, err := v.operator.is(ctx, req.UserInfo)
	if err != nil || operator {
		return nil, err
	}
	var errs field.ErrorList
	meta := field.NewPath("metadata")
	if jobNameRE.MatchString(job.Name) {
		errs = append(errs, field.Forbidden(meta.Child("name"), fmt.Sprintf(
			"%q may not make a BuildJob named after a Buildkite job (a job UUID): those names are the operator's own. Name a BuildJob made by hand otherwise, such as try-%s",
			req.UserInfo.Username, job.Spec.BuildEnvironment)))
	}
	if _, ok := job.Annotations[bkv1.AnnotationIntake]; ok {
		errs = append(errs, field.Forbidden(meta.Child("annotations").Key(bkv1.AnnotationIntake), fmt.Sprintf(
			"%q may not set this annotation: only the operator marks the BuildJobs it makes from Buildkite jobs. Remove it; a BuildJob made by hand runs without Buildkite",
			req.UserInfo.Username)))
	}
	return errs, nil
}
