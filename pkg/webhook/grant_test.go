package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// grantNS is where the attackers of these tests work: a job namespace with the chart's user
// RBAC, Secrets that are not theirs and a service account that may deploy.
const grantNS = "grant"

// The chart's user ClusterRoles, for a release buildkite-operator in buildkite.
const (
	chartEditRole    = "buildkite-operator-buildkite-edit"
	chartGranterRole = "buildkite-operator-buildkite-environment-granter"
	// testGranterRole is the granter ClusterRole the webhook names in these tests, whose
	// Options name no Service or namespace.
	testGranterRole = "buildkite-operator-environment-granter"
)

// grantFixtures makes grantNS, its Secrets and service account, and applies the chart's
// user ClusterRoles (rendered from templates/user-rbac.yaml), once for the package.
func grantFixtures(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	out, err := helmchart.Render("buildkite", "--show-only", "templates/user-rbac.yaml")
	require.NoError(t, err)
	objs, err := helmchart.Objects(out)
	require.NoError(t, err)
	require.Len(t, objs, 3, "the chart's user ClusterRoles: edit, view and environment-granter")
	for _, o := range objs {
		createOnce(t, o)
	}
	createOnce(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: grantNS}})
	for _, s := range []string{"deploy-key", "readable"} {
		createOnce(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s, Namespace: grantNS}, Data: map[string][]byte{"key": []byte("secret " + s)}})
	}
	createOnce(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer", Namespace: grantNS}})
	require.NoError(t, ctx.Err())
}

func createOnce(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), o); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err, "creating %T %s", o, o.GetName())
	}
}

// impersonate is a client of the API server acting as user, with nothing but what the
// RoleBindings of grantNS give them (and what every authenticated user may do).
func impersonate(t *testing.T, user string, clusterRoles ...string) client.Client {
	t.Helper()
	ctx := context.Background()
	for _, role := range clusterRoles {
		require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: user + "-" + role, Namespace: grantNS},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		}))
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	return c
}

// editorRoles are the ClusterRoles a user bound to the built-in edit role has: edit and
// every ClusterRole aggregated to it. envtest runs no controller-manager, whose aggregation
// controller would fold them into edit, so the test binds each, the chart's among them.
func editorRoles(t *testing.T) []string {
	t.Helper()
	var roles rbacv1.ClusterRoleList
	require.NoError(t, env.Client.List(context.Background(), &roles, client.MatchingLabels{"rbac.authorization.k8s.io/aggregate-to-edit": "true"}))
	names := []string{"edit"}
	for _, r := range roles.Items {
		names = append(names, r.Name)
	}
	require.Contains(t, names, chartEditRole)
	return names
}

func privilegedEnv(e *bkv1.BuildEnvironment) {
	e.Spec.Sidecars = []corev1.Container{{Name: "dind", Image: "docker:27-dind", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
	e.Spec.Allow.Privileged = true
}

func secretEnv(name string) gen.BuildEnvironmentModifier {
	return func(e *bkv1.BuildEnvironment) {
		e.Spec.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}
		e.Spec.Allow.Secrets = []string{name}
	}
}

func serviceAccountEnv(e *bkv1.BuildEnvironment) {
	e.Spec.ServiceAccountName = "deployer"
	e.Spec.Allow.ServiceAccount = true
}

func grantEnv(name string, mods ...gen.BuildEnvironmentModifier) *bkv1.BuildEnvironment {
	return environment(name, append([]gen.BuildEnvironmentModifier{gen.SetBuildEnvironmentNamespace(grantNS)}, mods...)...)
}

func notGranter(user, env, grants string) string {
	return fmt.Sprintf(`spec.allow: Forbidden: %q may not grant privileges in BuildEnvironment %q (verb grant on buildenvironments.buildkite-operator.dev), and this environment grants %s; remove them, or have a cluster administrator bind the ClusterRole %q to you in namespace %q`,
		user, env, grants, testGranterRole, grantNS)
}

// Privileges follow the requester: a namespace editor may write BuildEnvironments, but not
// one whose spec.allow grants anything; one bound to the chart's environment-granter role
// may, but only Secrets they may read themselves and a service account they may act as.
func TestEnvironmentGrant(t *testing.T) {
	ctx := context.Background()
	grantFixtures(t)
	editor := impersonate(t, "mallory", editorRoles(t)...)
	granter := impersonate(t, "grace", append(editorRoles(t), chartGranterRole)...)
	// May write environments and grant, but is no editor: reads one Secret only, and may
	// not act as the service account.
	lead := impersonate(t, "gus", chartEditRole, chartGranterRole)
	require.NoError(t, env.Client.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "gus-readable", Namespace: grantNS},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{"readable"}}},
	}))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gus-readable", Namespace: grantNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "gus-readable"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "gus"}},
	}))

	for i, tc := range []struct {
		name string
		c    client.Client
		mod  gen.BuildEnvironmentModifier
		// want is the error our webhook reports, %s for the environment's name; empty:
		// admitted.
		want string
	}{
		{name: "an editor, nothing allowed", c: editor, mod: func(*bkv1.BuildEnvironment) {}},
		{name: "an editor, another job's Secret", c: editor, mod: secretEnv("deploy-key"),
			want: notGranter("mallory", "%[1]s", `secrets ["deploy-key"]`)},
		{name: "an editor, a service account", c: editor, mod: serviceAccountEnv,
			want: notGranter("mallory", "%[1]s", `serviceAccount`)},
		{name: "an editor, privileged", c: editor, mod: privilegedEnv,
			want: notGranter("mallory", "%[1]s", `privileged`)},
		{name: "an editor, a shared claim, a priority and tolerate-all", c: editor, mod: func(e *bkv1.BuildEnvironment) {
			e.Spec.PriorityClassName = "production"
			e.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			e.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "payments-db"}}}}
			e.Spec.Allow = bkv1.Allow{PersistentVolumeClaims: []string{"payments-db"}, PriorityClasses: []string{"production"}, Tolerations: []string{"*"}}
		}, want: notGranter("mallory", "%[1]s", `persistentVolumeClaims ["payments-db"], priorityClasses ["production"], tolerations ["*"]`)},

		{name: "an editor and granter, another job's Secret", c: granter, mod: secretEnv("deploy-key")},
		{name: "an editor and granter, a service account", c: granter, mod: serviceAccountEnv},
		{name: "an editor and granter, privileged", c: granter, mod: privilegedEnv},

		{name: "a granter, privileged", c: lead, mod: privilegedEnv},
		{name: "a granter, a Secret they may read", c: lead, mod: secretEnv("readable")},
		{name: "a granter, a Secret they may not read", c: lead, mod: secretEnv("deploy-key"),
			want: `spec.allow.secrets[0]: Forbidden: "gus" may not get Secret "deploy-key", so may not let jobs read it either; list only Secrets you may read`},
		{name: "a granter, a service account they may not act as", c: lead, mod: serviceAccountEnv,
			want: `spec.serviceAccountName: Forbidden: "gus" may not create tokens of service account "deployer" (create serviceaccounts/token), so may not let jobs run as it either; name a service account you may act as`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := grantEnv(fmt.Sprintf("granted-%d", i), tc.mod)
			err := tc.c.Create(ctx, e)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "the API server admitted the BuildEnvironment")
			want := tc.want
			if strings.Contains(want, "%[1]s") {
				want = fmt.Sprintf(want, e.Name)
			}
			assert.EqualError(t, err, envDenied(e.Name, want))
		})
	}
}

// Changing the spec of an environment that grants something needs the verb grant too: a
// new image or command would run with the same privileges. Its metadata does not.
func TestEnvironmentGrantOnUpdate(t *testing.T) {
	ctx := context.Background()
	grantFixtures(t)
	editor := impersonate(t, "mallory-updates", editorRoles(t)...)
	e := grantEnv("deploy", secretEnv("deploy-key"))
	require.NoError(t, env.Client.Create(ctx, e), "an administrator may grant")

	require.NoError(t, editor.Get(ctx, client.ObjectKeyFromObject(e), e))
	e.Labels = map[string]string{"team": "payments"}
	require.NoError(t, editor.Update(ctx, e), "a metadata-only update passes")

	e.Spec.Image = "registry.example.com/attacker/exfiltrate:1"
	err := editor.Update(ctx, e)
	require.Error(t, err, "an editor changed what runs with the environment's Secret")
	assert.EqualError(t, err, envDenied(e.Name, notGranter("mallory-updates", "deploy", `secrets ["deploy-key"]`)))

	require.NoError(t, editor.Get(ctx, client.ObjectKeyFromObject(e), e))
	e.Spec.EnvFrom, e.Spec.Allow = nil, bkv1.Allow{}
	require.NoError(t, editor.Update(ctx, e), "taking the privileges away needs no grant")
	require.NoError(t, editor.Delete(ctx, e))
}
