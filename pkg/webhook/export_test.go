package webhook

import (
	"context"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// HandMadeErrors runs the BuildJob webhook's check of hand-made BuildJobs for a request by
// user, looking up the job's environment (as Admission.Check does) and asking the API
// server with c, for an operator that is whoever operator authenticates as: the tests'
// webhook server runs as the API server's admin, who may do anything, so only another
// identity shows that the operator is not asked.
func HandMadeErrors(ctx context.Context, c, operator client.Client, user authenticationv1.UserInfo, job *bkv1.BuildJob) (field.ErrorList, error) {
	v := &buildJobValidator{writer: c, operator: &operatorIdentity{c: operator}}
	ctx = admission.NewContextWithRequest(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UserInfo: user}})
	env, err := validation.GetEnvironment(ctx, c, job.Namespace, job.Spec.BuildEnvironment)
	if err != nil {
		return nil, err
	}
	return v.handMadeErrors(ctx, job, env)
}
