package webhook

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// The webhook asks the API server whether the user who creates a BuildJob may read the
// Secret it names.
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",namespace=buildkite-jobs,resources=secrets,verbs=get

// trustErrors checks what a BuildJob makes the operator do with its own rights: read the
// Secret tokenSecretRef names (the controller, and the job's pod through its env) and send
// it to agentEndpoint. The endpoint must be the operator's own (validation.EndpointAllowed);
// the Secret must be the BuildJob's own token Secret, as the spawner names it, or one the
// requesting user may read themselves, so that BuildJobs made by hand keep working without
// letting anyone read a Secret through the operator.
func (v *buildJobValidator) trustErrors(ctx context.Context, job *bkv1.BuildJob) (field.ErrorList, error) {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if !validation.EndpointAllowed(job.Spec.AgentEndpoint, v.agentEndpoint) {
		errs = append(errs, field.Forbidden(spec.Child("agentEndpoint"), fmt.Sprintf(
			"the operator sends job tokens only to its own Buildkite endpoint %q (or another host of its domain); leave agentEndpoint empty or set it to that",
			v.agentEndpoint)))
	}

	name, own := job.Spec.TokenSecretRef.Name, spawner.TokenSecretName(job.Name)
	if name == own {
		ok, err := v.ownTokenSecret(ctx, job)
		if err != nil || ok {
			return errs, err
		}
	}
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("no admission request to learn who creates BuildJob %s: %w", job.Name, err)
	}
	allowed, err := v.mayGetSecret(ctx, req.UserInfo, job.Namespace, name)
	if err != nil {
		return nil, err
	}
	if !allowed {
		errs = append(errs, field.Forbidden(spec.Child("tokenSecretRef", "name"), fmt.Sprintf(
			"%q may not get Secret %q, which is not this BuildJob's own token Secret %q: the operator and the job's pod would read it for you; name a Secret you may read, or put the job token in %q",
			req.UserInfo.Username, name, own, own)))
	}
	return errs, nil
}

// ownTokenSecret reports whether the BuildJob's own token Secret is safe to use: it does
// not exist yet (the spawner makes it just after the BuildJob), or it belongs to a BuildJob
// of this name. An existing Secret that merely has the name is someone else's.
func (v *buildJobValidator) ownTokenSecret(ctx context.Context, job *bkv1.BuildJob) (bool, error) {
	var s corev1.Secret
	err := v.reader.Get(ctx, client.ObjectKey{Namespace: job.Namespace, Name: job.Spec.TokenSecretRef.Name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("getting Secret %s/%s: %w", job.Namespace, job.Spec.TokenSecretRef.Name, err)
	}
	owner := metav1.GetControllerOf(&s)
	return owner != nil && owner.Kind == "BuildJob" && owner.Name == job.Name &&
		owner.APIVersion == bkv1.GroupVersion.String(), nil
}

// mayGetSecret asks the API server whether user may get the Secret.
func (v *buildJobValidator) mayGetSecret(ctx context.Context, user authenticationv1.UserInfo, namespace, name string) (bool, error) {
	extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
	for k, val := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(val)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "get", Resource: "secrets", Name: name,
		},
	}}
	if err := v.writer.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("asking whether %q may get Secret %s/%s: %w", user.Username, namespace, name, err)
	}
	return sar.Status.Allowed, nil
}
