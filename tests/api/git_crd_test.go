package api_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// The schema of spec.git and spec.agent.image: what it takes is stored as written, what it
// refuses is refused with a message that says what to write instead (before any webhook).
func TestGitAndAgentImageSchema(t *testing.T) {
	ctx := context.Background()
	withGit := func(name string, g bkv1.GitSettings) *bkv1.BuildEnvironment {
		e := validEnv(name)
		e.Spec.Git = g
		return e
	}
	t.Run("stored as written", func(t *testing.T) {
		e := withGit("git-roundtrip", bkv1.GitSettings{
			SSHSecret:         &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"},
			CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "github", URL: "https://github.com", PasswordKey: "token"},
		})
		e.Spec.Agent.Image = "buildkite/agent:3.138.1"
		e.Spec.Agent.ImagePullPolicy = corev1.PullIfNotPresent
		require.NoError(t, env.Client.Create(ctx, e))
		var got bkv1.BuildEnvironment
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got))
		assert.Equal(t, e.Spec.Git, got.Spec.Git)
		assert.Equal(t, "buildkite/agent:3.138.1", got.Spec.Agent.Image)
	})

	cases := []struct {
		name string
		obj  *bkv1.BuildEnvironment
		want string
	}{
		{"a credentials file and a server", withGit("git-both", bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{
			Name: "git-https", Key: ".git-credentials", URL: "https://github.com"}}),
			"credentialsSecret takes key (a git-credentials file) or url (with a username and a password), not both"},
		{"a password key without a server", withGit("git-no-url", bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{
			Name: "git-https", PasswordKey: "token"}}),
			"credentialsSecret.usernameKey and passwordKey need url: the https server the username and password are for"},
		{"an SSH Secret without a name", withGit("git-no-name", bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{}}),
			"spec.git.sshSecret.name"},
		{"a key that is no Secret key", withGit("git-bad-key", bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "k", KeyKey: "id/rsa"}}),
			`spec.git.sshSecret.keyKey: Invalid value: "id/rsa"`},
	}
	agentImage := validEnv("agent-image-spaced")
	agentImage.Spec.Agent.Image = "buildkite/agent 3"
	cases = append(cases, struct {
		name string
		obj  *bkv1.BuildEnvironment
		want string
	}{"an agent image with a space", agentImage, "agent.image must not contain spaces"})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(ctx, tc.obj)
			require.Error(t, err, "the apiserver accepted an invalid object")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
