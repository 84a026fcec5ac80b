package webhook

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// The webhooks ask the API server what the user who writes a BuildJob or a
// BuildEnvironment could do directly (userMay).
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// trustErrors checks where a BuildJob makes the operator send job tokens: only to the
// operator's own endpoint, or one it was told to allow (validation.EndpointAllowed). The
// Secret tokenSecretRef names needs no check: the controller reads a job token only from a
// Secret the spawner sealed for that very BuildJob (pkg/seal), and the pod of a BuildJob
// made by hand gets no token at all.
func (v *buildJobValidator) trustErrors(job *bkv1.BuildJob) field.ErrorList {
	var errs field.ErrorList
	if !validation.EndpointAllowed(job.Spec.AgentEndpoint, v.agentEndpoint, v.allowedEndpoints...) {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "agentEndpoint"), fmt.Sprintf(
			"the operator sends job tokens only to its own Buildkite endpoint %q and those listed in its --allowed-agent-endpoints, each exactly; leave agentEndpoint empty or set it to one of them",
			v.agentEndpoint)))
	}
	return errs
}

// userMay asks the API server, with a SubjectAccessReview made by w, whether user (as an
// admission request names them: groups and extra included, so that the answer is the one
// the user would get) may do what attrs say. Every check of what a requester could do
// directly goes through it.
func userMay(ctx context.Context, w client.Writer, user authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error) {
	extra := make(map[string]authorizationv1.ExtraValue, len(user.Extra))
	for k, val := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(val)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		ResourceAttributes: &attrs,
	}}
	if err := w.Create(ctx, sar); err != nil {
		what := attrs.Resource
		if attrs.Subresource != "" {
			what += "/" + attrs.Subresource
		}
		if attrs.Group != "" {
			what += "." + attrs.Group
		}
		return false, fmt.Errorf("asking whether %q may %s %s %s/%s: %w", user.Username, attrs.Verb, what, attrs.Namespace, attrs.Name, err)
	}
	return sar.Status.Allowed, nil
}

// mayGetSecret asks whether user may get Secret name in namespace ns.
func mayGetSecret(ctx context.Context, w client.Writer, user authenticationv1.UserInfo, ns, name string) (bool, error) {
	return userMay(ctx, w, user, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "secrets", Name: name})
}

// mayActAs asks whether user may create tokens of service account sa in namespace ns: act
// as it, as a pod running as it does.
func mayActAs(ctx context.Context, w client.Writer, user authenticationv1.UserInfo, ns, sa string) (bool, error) {
	return userMay(ctx, w, user, authorizationv1.ResourceAttributes{
		Namespace: ns, Verb: "create", Resource: "serviceaccounts", Subresource: "token", Name: sa,
	})
}

// runsAs is the service account env's pods run as with its Kubernetes API access, "" when
// they run as none but the namespace's default (which gets no token without the allow).
func runsAs(env *bkv1.BuildEnvironment) string {
	if sa := env.Spec.ServiceAccountName; env.Spec.Allow.ServiceAccount && sa != "default" {
		return sa
	}
	return ""
}
