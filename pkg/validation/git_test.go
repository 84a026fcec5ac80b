package validation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// allowGitSecrets lists the Secrets of e's spec.git in spec.allow.secrets, as an
// environment that may use them does.
func allowGitSecrets(e *bkv1.BuildEnvironment) {
	if s := e.Spec.Git.SSHSecret; s != nil {
		e.Spec.Allow.Secrets = append(e.Spec.Allow.Secrets, s.Name)
	}
	if s := e.Spec.Git.CredentialsSecret; s != nil {
		e.Spec.Allow.Secrets = append(e.Spec.Allow.Secrets, s.Name)
	}
}

// spec.git and spec.agent.image: what is wrong says what to write instead; what is legal but
// weaker than it looks is a warning.
func TestGitAndAgentImage(t *testing.T) {
	ssh := func(s bkv1.GitSSHSecret) func(*bkv1.BuildEnvironment) {
		return func(e *bkv1.BuildEnvironment) { e.Spec.Git.SSHSecret = &s }
	}
	creds := func(c bkv1.GitCredentialsSecret) func(*bkv1.BuildEnvironment) {
		return func(e *bkv1.BuildEnvironment) { e.Spec.Git.CredentialsSecret = &c }
	}
	noKnownHosts := `spec.git.sshSecret: no knownHostsKey, so ssh takes any server's host key unverified, and a server posing as yours gets the checkout; add the servers' known_hosts lines to Secret "deploy-key" and name their key in knownHostsKey`
	cases := []struct {
		name         string
		set          func(*bkv1.BuildEnvironment)
		want         []string
		wantWarnings []string
	}{
		{name: "an SSH key with known_hosts", set: ssh(bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"})},
		{name: "an SSH key without known_hosts", set: ssh(bkv1.GitSSHSecret{Name: "deploy-key", KeyKey: "id_ed25519"}),
			wantWarnings: []string{noKnownHosts}},
		{name: "a git-credentials file", set: creds(bkv1.GitCredentialsSecret{Name: "git-https", Key: "credentials"})},
		{name: "a username and password for a server with a port", set: creds(bkv1.GitCredentialsSecret{Name: "git-https", URL: "https://git.example.com:8443/"})},
		{
			name: "names that are no Secret's",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "Deploy_Key", KeyKey: "id/rsa", KnownHostsKey: "known_hosts"}
				e.Spec.Git.CredentialsSecret = &bkv1.GitCredentialsSecret{Name: "git-https", Key: "a key"}
			},
			want: []string{
				`spec.git.sshSecret.name: Invalid value: "Deploy_Key": not a Secret name: lowercase letters, digits, '-' and '.', such as deploy-key`,
				`spec.git.sshSecret.keyKey: Invalid value: "id/rsa": not a Secret key: letters, digits, '-', '_' and '.', such as ssh-privatekey`,
				`spec.git.credentialsSecret.key: Invalid value: "a key": not a Secret key: letters, digits, '-', '_' and '.', such as ssh-privatekey`,
			},
		},
		{
			name: "known_hosts in the private key's key",
			set:  ssh(bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "ssh-privatekey"}),
			want: []string{`spec.git.sshSecret.knownHostsKey: Invalid value: "ssh-privatekey": names the key of the private key; the known_hosts lines need a key of their own, such as known_hosts`},
		},
		{
			name: "a file and a server",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", Key: ".git-credentials", URL: "https://github.com"}),
			want: []string{`spec.git.credentialsSecret.key: Invalid value: ".git-credentials": a git-credentials file (key) names its servers itself; give either key, or url with a username and a password, not both`},
		},
		{
			name: "a username without its server",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", UsernameKey: "user"}),
			want: []string{`spec.git.credentialsSecret.url: Required value: usernameKey and passwordKey need url, the https server the username and password are for, such as https://github.com`},
		},
		{
			name: "a password over plain http",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", URL: "http://git.example.com"}),
			want: []string{`spec.git.credentialsSecret.url: Invalid value: "http://git.example.com": must be an https URL, such as https://github.com: git sends the password to this server, and over plain http anyone on the way could read it (for an http server, put it in a git-credentials file with key instead)`},
		},
		{
			name: "a repository, not a server",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", URL: "https://github.com/acme/app.git"}),
			want: []string{`spec.git.credentialsSecret.url: Invalid value: "https://github.com/acme/app.git": must be the server alone (https://github.com, not a repository or organization under it): git matches credentials by server`},
		},
		{
			name: "a user in the URL",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", URL: "https://bot:hunter2@github.com"}),
			want: []string{`spec.git.credentialsSecret.url: Invalid value: "https://bot:hunter2@github.com": must not hold a user or password: they come from the Secret's usernameKey and passwordKey`},
		},
		{
			name: "no server",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", URL: "github.com"}),
			want: []string{`spec.git.credentialsSecret.url: Invalid value: "github.com": must be an https URL, such as https://github.com: git sends the password to this server, and over plain http anyone on the way could read it (for an http server, put it in a git-credentials file with key instead)`},
		},
		{
			name: "the username and password in one key",
			set:  creds(bkv1.GitCredentialsSecret{Name: "git-https", URL: "https://github.com", PasswordKey: "username"}),
			want: []string{`spec.git.credentialsSecret.passwordKey: Invalid value: "username": names the key of the username; the password needs a key of its own, such as password`},
		},
		{
			name: "a mount where the key goes",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}
				e.Spec.Volumes = []corev1.Volume{{Name: "keys", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
				e.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "keys", MountPath: "/buildkite/git-ssh/"}}
			},
			want: []string{`spec.volumeMounts[0].mountPath: Invalid value: "/buildkite/git-ssh/": /buildkite/git-ssh is where the operator mounts spec.git.sshSecret in the job's container; mount this volume elsewhere`},
		},
		{
			name: "the environment's env replaces git's settings",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}
				e.Spec.Git.CredentialsSecret = &bkv1.GitCredentialsSecret{Name: "git-https"}
				e.Spec.Env = []corev1.EnvVar{{Name: "GIT_SSH_COMMAND", Value: "ssh -v"}, {Name: "GIT_CONFIG_KEY_1", Value: "core.longpaths"}}
			},
			wantWarnings: []string{
				`spec.env sets GIT_SSH_COMMAND, which replaces the ssh command that uses the key of spec.git.sshSecret (mounted at /buildkite/git-ssh/key): git will not use the key unless your command does`,
				`spec.env sets GIT_CONFIG_KEY_1, and the operator gives git the credential helper of spec.git.credentialsSecret through GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n and GIT_CONFIG_VALUE_n: the environment's values replace the operator's, so the credentials may not be used`,
			},
		},
		{name: "the environment's own agent image", set: func(e *bkv1.BuildEnvironment) { e.Spec.Agent.Image = "registry.example.com/ci/agent@sha256:" + sha }},
		{
			name: "an agent image that is no reference",
			set:  func(e *bkv1.BuildEnvironment) { e.Spec.Agent.Image = "Buildkite/Agent:3" },
			want: []string{`spec.agent.image: Invalid value: "Buildkite/Agent:3": not a valid image reference (invalid reference format: repository name (Agent) must be lowercase); give an image with buildkite-agent at /usr/local/bin/buildkite-agent, such as buildkite/agent:3.138.1 or registry.example.com/ci/agent@sha256:..., or leave it out for the operator's`},
		},
		{
			name:         "an agent image that floats",
			set:          func(e *bkv1.BuildEnvironment) { e.Spec.Agent.Image = "buildkite/agent" },
			wantWarnings: []string{`spec.agent.image: "buildkite/agent" runs whatever buildkite-agent the registry tags latest, so the same build may get another agent tomorrow; pin a release (buildkite/agent:3.138.1) or a digest`},
		},
		{
			name: "a volume of the environment's named as a git Secret's",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{{Name: "buildkite-git-credentials", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			},
			want: []string{`spec.volumes[0].name: Invalid value: "buildkite-git-credentials": "buildkite-git-credentials" is reserved for a volume the operator adds to every job pod; choose another name`},
		},
		{
			name: "an init container named as the agent's",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.InitContainers = []corev1.Container{{Name: "buildkite-agent-install", Image: "busybox:1.37"}}
			},
			want: []string{`spec.initContainers[0].name: Invalid value: "buildkite-agent-install": "buildkite-agent-install" is reserved for a container the operator adds to every job pod; choose another name`},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(tc.set, allowGitSecrets)
			errs, warnings := validation.BuildEnvironment(env)
			assert.Equal(t, tc.want, messages(errs))
			for _, w := range tc.wantWarnings {
				assert.Contains(t, warnings, w)
			}
			// No warning but those of the case, besides the environment's own.
			_, base := validation.BuildEnvironment(testEnv())
			assert.Len(t, warnings, len(base)+len(tc.wantWarnings), "warnings: %q", warnings)
		})
	}
}

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The git Secrets are privileges like any Secret the environment's pods get: named by
// EnvironmentPrivileges and EnvironmentSecrets, which the hand-made BuildJob checks and the
// grant gate of the webhook read.
func TestGitSecretsArePrivileges(t *testing.T) {
	env := testEnv(func(e *bkv1.BuildEnvironment) {
		e.Spec.Env = []corev1.EnvVar{{Name: "NPM_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "npm"}, Key: "token"}}}}
		e.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}
		e.Spec.Git.CredentialsSecret = &bkv1.GitCredentialsSecret{Name: "npm"}
	})
	assert.Equal(t, []string{`Secret "npm"`, `Secret "deploy-key"`}, validation.EnvironmentPrivileges(env))
	assert.Equal(t, []string{"npm", "deploy-key"}, validation.EnvironmentSecrets(env))
	assert.Equal(t, []string{
		`spec.env[0].valueFrom.secretKeyRef.name: Forbidden: Secret "npm" is not in spec.allow.secrets; list it there to let jobs read it`,
		`spec.git.sshSecret.name: Forbidden: Secret "deploy-key" is not in spec.allow.secrets; list it there to let jobs read it`,
		`spec.git.credentialsSecret.name: Forbidden: Secret "npm" is not in spec.allow.secrets; list it there to let jobs read it`,
	}, messages(validation.Privileges(env)))
}
