package webhook_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// handMadeFixtures makes, as an administrator, environments that give their pods a Secret, a
// service account, or nothing, with allowedPipelines that a BuildJob made by hand simply
// names.
func handMadeFixtures(t *testing.T) {
	t.Helper()
	grantFixtures(t)
	for _, e := range []*bkv1.BuildEnvironment{
		grantEnv("plain"),
		grantEnv("with-secret", secretEnv("deploy-key")),
		grantEnv("with-pull-secret", func(e *bkv1.BuildEnvironment) {
			e.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "deploy-key"}}
		}),
		grantEnv("with-sa", serviceAccountEnv),
	} {
		createOnce(t, e)
	}
}

func handMadeJob(environment string) *bkv1.BuildJob {
	// The slug is whatever the maker types: one the environment allows.
	return job(gen.SetBuildJobNamespace(grantNS), gen.SetBuildJobEnvironment(environment), gen.SetBuildJobPipeline("my-deploys"))
}

// A BuildJob made by hand gets its environment's Secrets and service account only for a
// maker who could get them directly: allowedPipelines cannot tell, since the maker names the
// pipeline. The operator's own BuildJobs are not asked about.
func TestHandMadeBuildJob(t *testing.T) {
	ctx := context.Background()
	handMadeFixtures(t)
	// May create BuildJobs, and nothing else: no Secrets, no service account tokens.
	bob := impersonate(t, "bob", chartEditRole)
	// An editor may read the namespace's Secrets and create tokens anyway.
	editor := impersonate(t, "mallory-jobs", editorRoles(t)...)

	for _, tc := range []struct {
		name, env string
		c         string
		// want is the error our webhook reports; empty: admitted.
		want string
	}{
		{name: "an environment that gives nothing", c: "bob", env: "plain"},
		{name: "an environment's Secret", c: "bob", env: "with-secret",
			want: `spec.buildEnvironment: Forbidden: "bob" may not get Secret "deploy-key", which BuildEnvironment "with-secret" gives its pods: a BuildJob made by hand names its own pipeline, so the environment's allowedPipelines cannot keep it out, and its pod would have them for you; choose an environment without them, or ask for that access`},
		{name: "an environment's image pull Secret", c: "bob", env: "with-pull-secret",
			want: `spec.buildEnvironment: Forbidden: "bob" may not get Secret "deploy-key", which BuildEnvironment "with-pull-secret" gives its pods: a BuildJob made by hand names its own pipeline, so the environment's allowedPipelines cannot keep it out, and its pod would have them for you; choose an environment without them, or ask for that access`},
		{name: "an environment's service account", c: "bob", env: "with-sa",
			want: `spec.buildEnvironment: Forbidden: "bob" may not create tokens of service account "deployer", which BuildEnvironment "with-sa" gives its pods: a BuildJob made by hand names its own pipeline, so the environment's allowedPipelines cannot keep it out, and its pod would have them for you; choose an environment without them, or ask for that access`},
		{name: "an editor, who may read the Secret", c: "editor", env: "with-secret"},
		{name: "an editor, who may act as the service account", c: "editor", env: "with-sa"},
		// The operator: in these tests the webhook server runs as the API server's admin.
		{name: "the operator, an environment's Secret", c: "operator", env: "with-secret"},
		{name: "the operator, an environment's service account", c: "operator", env: "with-sa"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := map[string]client.Client{"bob": bob, "editor": editor, "operator": env.Client}[tc.c]
			j := handMadeJob(tc.env)
			err := c.Create(ctx, j)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err, "the API server admitted the BuildJob")
			assert.EqualError(t, err, jobDenied(j.Name, tc.want))
		})
	}
}

// Who the operator is comes from the API server: the same BuildJob, asked for by the
// operator's identity, is not checked, and asked for by anyone else with the same rights,
// is refused. The webhook server of these tests runs as the API server's admin, who would
// pass the check anyway, so this runs the check with another identity for the operator.
func TestHandMadeCheckSkipsTheOperator(t *testing.T) {
	ctx := context.Background()
	handMadeFixtures(t)
	const operator = "system:serviceaccount:" + grantNS + ":operator"
	opClient := impersonate(t, operator)
	j := handMadeJob("with-sa")

	errs, err := webhook.HandMadeErrors(ctx, env.Client, opClient, authenticationv1.UserInfo{Username: operator}, j)
	require.NoError(t, err)
	assert.Empty(t, errs, "the operator's own BuildJob")

	const impostor = "system:serviceaccount:" + grantNS + ":impostor"
	errs, err = webhook.HandMadeErrors(ctx, env.Client, opClient, authenticationv1.UserInfo{Username: impostor}, j)
	require.NoError(t, err)
	require.Len(t, errs, 1, "a BuildJob by someone else with the same rights")
	assert.Equal(t, field.ErrorTypeForbidden, errs[0].Type)
	assert.Contains(t, errs[0].Detail, fmt.Sprintf(`%q may not create tokens of service account "deployer"`, impostor))
}
