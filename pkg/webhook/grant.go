package webhook

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// GrantVerb is the verb on buildenvironments that lets a user write an environment whose
// spec.allow grants anything. It is RBAC's escalate for BuildEnvironments: a namespace's
// editors may write environments, but the privileges of spec.allow reach every job that
// uses the environment, so granting them is a permission of its own, which the built-in
// edit and admin roles do not have (the chart's <fullname>-<namespace>-environment-granter
// ClusterRole has it).
const GrantVerb = "grant"

// granterClusterRole is the ClusterRole the webhook's refusals send users to: the one the
// Helm chart makes, named as the chart names it, from the webhook Service (<fullname>-webhook)
// and the operator's namespace.
func granterClusterRole(opts Options) string {
	if opts.GranterClusterRole != "" {
		return opts.GranterClusterRole
	}
	service := opts.ServiceName
	if service == "" {
		service = DefaultServiceName
	}
	name := strings.TrimSuffix(service, "-webhook")
	if opts.Namespace != "" {
		name += "-" + opts.Namespace
	}
	return name + "-environment-granter"
}

// grantErrors checks that the user who writes env could give its pods what env.Spec.Allow
// grants without the operator: the verb grant on this BuildEnvironment, get on each Secret of
// allow.secrets, and create on the token of the service account allow.serviceAccount lets
// the pods run as. Without it, anyone who may edit a BuildEnvironment would get, through the
// operator and a job, every Secret and service account of the namespace and the node itself.
func (v *buildEnvironmentValidator) grantErrors(ctx context.Context, env *bkv1.BuildEnvironment) (field.ErrorList, error) {
	asked := grants(&env.Spec.Allow)
	if len(asked) == 0 {
		return nil, nil
	}
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("no admission request to learn who writes BuildEnvironment %s: %w", env.Name, err)
	}
	user, ns := req.UserInfo, env.Namespace
	if ns == "" {
		ns = req.Namespace
	}
	allow := field.NewPath("spec", "allow")
	var errs field.ErrorList

	ok, err := userMay(ctx, v.writer, user, authorizationv1.ResourceAttributes{
		Namespace: ns, Verb: GrantVerb, Group: bkv1.GroupVersion.Group, Resource: "buildenvironments", Name: env.Name,
	})
	if err != nil {
		return nil, err
	}
	if !ok {
		errs = append(errs, field.Forbidden(allow, fmt.Sprintf(
			"%q may not grant privileges in BuildEnvironment %q (verb %s on buildenvironments.%s), and this environment grants %s; remove them, or have a cluster administrator bind the ClusterRole %q to you in namespace %q",
			user.Username, env.Name, GrantVerb, bkv1.GroupVersion.Group, strings.Join(asked, ", "), v.granterRole, ns)))
	}

	for i, name := range env.Spec.Allow.Secrets {
		ok, err := mayGetSecret(ctx, v.writer, user, ns, name)
		if err != nil {
			return nil, err
		}
		if !ok {
			errs = append(errs, field.Forbidden(allow.Child("secrets").Index(i), fmt.Sprintf(
				"%q may not get Secret %q, so may not let jobs read it either; list only Secrets you may read", user.Username, name)))
		}
	}

	if sa := runsAs(env); sa != "" {
		ok, err := mayActAs(ctx, v.writer, user, ns, sa)
		if err != nil {
			return nil, err
		}
		if !ok {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "serviceAccountName"), fmt.Sprintf(
				"%q may not create tokens of service account %q (create serviceaccounts/token), so may not let jobs run as it either; name a service account you may act as",
				user.Username, sa)))
		}
	}
	return errs, nil
}

// grants describes each field of allow that is set, as written in spec.allow
// ("privileged", `secrets ["db"]`), for the refusal. It reads the fields by reflection so
// that a privilege added to Allow needs the verb grant without anyone remembering to add it
// here.
func grants(allow *bkv1.Allow) []string {
	var out []string
	v := reflect.ValueOf(allow).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		switch {
		case f.Kind() == reflect.Slice && f.Len() > 0:
			out = append(out, fmt.Sprintf("%s %q", name, f.Interface()))
		case f.Kind() != reflect.Slice && !f.IsZero():
			out = append(out, name)
		}
	}
	return out
}
