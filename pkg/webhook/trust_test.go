package webhook_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

const trustNS = "trust"

// userClient makes a user of the API server with the given namespaced rules and returns a
// client acting as them.
func userClient(t *testing.T, name string, rules ...rbacv1.PolicyRule) client.Client {
	t.Helper()
	ctx := context.Background()
	u, err := env.AddUser(envtest.User{Name: name}, env.Config)
	require.NoError(t, err)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: trustNS}, Rules: rules}
	require.NoError(t, env.Client.Create(ctx, role))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: trustNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
	}))
	c, err := client.New(u.Config(), client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	return c
}

var createBuildJobs = rbacv1.PolicyRule{APIGroups: []string{bkv1.GroupVersion.Group}, Resources: []string{"buildjobs"}, Verbs: []string{"create", "get"}}

// A BuildJob names the endpoint its job token goes to: the webhook lets a user name only
// the operator's endpoint, each exactly.
func TestBuildJobTrust(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: trustNS}}))
	require.NoError(t, env.Client.Create(ctx, environment("go", gen.SetBuildEnvironmentNamespace(trustNS))))
	for _, s := range []string{"registration"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s, Namespace: trustNS},
			Data:       map[string][]byte{"token": []byte("secret " + s)},
		}))
	}
	alice := userClient(t, "alice", createBuildJobs)

	for _, tc := range []struct {
		name   string
		mutate gen.BuildJobModifier
		// want is the error our webhook reports; empty: admitted.
		want string
	}{
		// tokenSecretRef of a BuildJob made by hand is not used at all (no token reaches
		// its pod, and the controller reads only Secrets the spawner sealed), so naming a
		// Secret the user may not read gives them nothing, and is not refused.
		{
			name:   "a Secret the user may not read",
			mutate: gen.SetBuildJobTokenSecretRef(bkv1.SecretKeyRef{Name: "registration", Key: "token"}),
		},
		{name: "the operator's endpoint", mutate: gen.SetBuildJobAgentEndpoint("https://agent.buildkite.com/v3")},
		{
			// Another host of the endpoint's domain is not the operator's: a sibling under
			// herokuapp.com or co.uk belongs to someone else. Hosts Buildkite moves agents
			// to are allowed by listing them (--allowed-agent-endpoints).
			name:   "another host of the operator's endpoint's domain",
			mutate: gen.SetBuildJobAgentEndpoint("https://agent-edge.buildkite.com/v3"),
			want:   `spec.agentEndpoint: Forbidden: the operator sends job tokens only to its own Buildkite endpoint "https://agent.buildkite.com/v3" and those listed in its --allowed-agent-endpoints, each exactly; leave agentEndpoint empty or set it to one of them`,
		},
		{
			name:   "any other endpoint",
			mutate: gen.SetBuildJobAgentEndpoint("https://collector.example.com/v3"),
			want:   `spec.agentEndpoint: Forbidden: the operator sends job tokens only to its own Buildkite endpoint "https://agent.buildkite.com/v3" and those listed in its --allowed-agent-endpoints, each exactly; leave agentEndpoint empty or set it to one of them`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := job(gen.SetBuildJobNamespace(trustNS), tc.mutate)
			err := alice.Create(ctx, j)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "the API server accepted the BuildJob")
			assert.EqualError(t, err, jobDenied(j.Name, tc.want))
		})
	}
}

// With the operator down (no webhook server), no BuildJob is admitted unchecked: the
// chart's BuildJob webhooks fail closed.
func TestBuildJobWebhooksFailClosed(t *testing.T) {
	webhooks, err := helmchart.WebhookManifests(t.TempDir(), "buildkite")
	require.NoError(t, err)
	e, err := testenv.Start(func(te *envtest.Environment) {
		te.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{webhooks}}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop() })
	// In the operator's own namespace, which its webhooks always cover.
	ctx := context.Background()
	require.NoError(t, e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "buildkite"}}))
	err = e.Client.Create(ctx, job(gen.SetBuildJobNamespace("buildkite")))
	require.Error(t, err, "a BuildJob was admitted without its webhooks")
	assert.Contains(t, err.Error(), "failed calling webhook")
}
