// Package attacker gives tests the rights of an ordinary user of a job namespace, so that
// the operator's trust rules are tried as an attacker would try them: through the API
// server, as a user the API server authorizes, not by calling the operator's code.
package attacker

import (
	"context"
	"fmt"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// User is the attacker's user name.
const User = "mallory@example.com"

// Editor makes User an editor of namespace ns, as a platform team makes a team's members:
// the built-in `edit` ClusterRole bound in ns, and the operator's resources as the chart's
// ClusterRole aggregated to `edit` grants them (envtest runs no controller manager to
// aggregate it, so the rules are given directly). It returns admin's rest.Config
// impersonating User. No privilege beyond what a namespace editor has by default.
func Editor(ctx context.Context, admin client.Client, cfg *rest.Config, ns string) (*rest.Config, error) {
	name := "attacker-edit"
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{bkv1.GroupVersion.Group},
			Resources: []string{"buildjobs", "buildenvironments"},
			Verbs:     []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"},
		}},
	}
	objs := []client.Object{role, binding(ns, name, "Role", name)}
	// `edit` is aggregated: its rules are filled in by the controller manager, which
	// envtest does not run, from system:aggregate-to-edit and -view (which the API server
	// bootstraps with their rules). Binding all three gives the same rights either way.
	for _, cr := range []string{"edit", "system:aggregate-to-edit", "system:aggregate-to-view"} {
		objs = append(objs, binding(ns, name+"-"+strings.ReplaceAll(cr, ":", "-"), "ClusterRole", cr))
	}
	for _, obj := range objs {
		if err := admin.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("giving %s edit rights in %s: %w", User, ns, err)
		}
	}
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{UserName: User, Groups: []string{"system:authenticated"}}
	return out, nil
}

// Client is Editor's rest.Config as a client.
func Client(ctx context.Context, admin client.Client, cfg *rest.Config, ns string) (client.Client, error) {
	ec, err := Editor(ctx, admin, cfg, ns)
	if err != nil {
		return nil, err
	}
	c, err := client.New(ec, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("a client as %s: %w", User, err)
	}
	return c, nil
}

// binding binds User to the role in namespace ns.
func binding(ns, name, kind, role string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: User}},
	}
}
