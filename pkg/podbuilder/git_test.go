package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// volume is the pod's volume called name, nil when it has none.
func volume(pod *corev1.Pod, name string) *corev1.Volume {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}

// What spec.git gives the job's pod: the Secrets' keys under fixed names, mounted read-only
// in the job container alone, and git's settings in its env as the container sees them.
func TestGitCredentials(t *testing.T) {
	const credentialsFile = `!f() { [ "$1" = get ] || exit 0; exec git credential-store --file=/buildkite/git-credentials/git-credentials get; }; f`
	const sshCommand = "ssh -i /buildkite/git-ssh/key -o IdentitiesOnly=yes "
	cases := []struct {
		name string
		git  bkv1.GitSettings
		// env are variables of the job container as the kubelet gives them; "<unset>" for none.
		env map[string]string
		// items are the keys each Secret volume projects, to the file each becomes.
		items map[string][]corev1.KeyToPath
	}{{
		name:  "nothing",
		env:   map[string]string{envGitSSHCommand: "<unset>", envGitConfigCount: "<unset>", envSSHKeyscan: "true"},
		items: map[string][]corev1.KeyToPath{podcontract.GitSSHVolume: nil, podcontract.GitCredentialsVolume: nil},
	}, {
		name: "an SSH key of a kubernetes.io/ssh-auth Secret, with known_hosts",
		git:  bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}},
		env: map[string]string{
			envGitSSHCommand: sshCommand + "-o UserKnownHostsFile=/buildkite/git-ssh/known_hosts -o StrictHostKeyChecking=yes",
			envSSHKeyscan:    "false", envGitConfigCount: "<unset>",
		},
		items: map[string][]corev1.KeyToPath{podcontract.GitSSHVolume: {{Key: "ssh-privatekey", Path: "key"}, {Key: "known_hosts", Path: "known_hosts"}}},
	}, {
		name: "an SSH key of another key, without known_hosts",
		git:  bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KeyKey: "id_ed25519"}},
		env: map[string]string{
			envGitSSHCommand: sshCommand + "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=accept-new",
			envSSHKeyscan:    "false",
		},
		items: map[string][]corev1.KeyToPath{podcontract.GitSSHVolume: {{Key: "id_ed25519", Path: "key"}}},
	}, {
		name: "a git-credentials file",
		git:  bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https"}},
		env: map[string]string{
			envGitConfigCount: "1", envGitConfigKey0: "credential.helper", envGitConfigValue0: credentialsFile,
			envGitSSHCommand: "<unset>", envSSHKeyscan: "true",
		},
		items: map[string][]corev1.KeyToPath{podcontract.GitCredentialsVolume: {{Key: ".git-credentials", Path: "git-credentials"}}},
	}, {
		name: "a username and password for one server",
		git: bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "github", URL: "https://github.com",
			PasswordKey: "token"}},
		env: map[string]string{
			envGitConfigCount: "1", envGitConfigKey0: "credential.https://github.com.helper",
			envGitConfigValue0: `!f() { [ "$1" = get ] || exit 0; printf 'username=%s\npassword=%s\n' "$(cat /buildkite/git-credentials/username)" "$(cat /buildkite/git-credentials/password)"; }; f`,
		},
		items: map[string][]corev1.KeyToPath{podcontract.GitCredentialsVolume: {{Key: "username", Path: "username"}, {Key: "token", Path: "password"}}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			env.Spec.Git = tc.git
			// Every Secret of the cases; allowing one more than is used changes nothing.
			env.Spec.Allow.Secrets = []string{"deploy-key", "git-https", "github"}
			job := baseJob()
			pod, err := Build(job, env, Options{PodSecurity: PodSecurityRestricted})
			require.NoError(t, err)
			got := containerEnv(t, pod.Spec.Containers[0], nil)
			for name, want := range tc.env {
				v, ok := got[name]
				if want == "<unset>" {
					assert.False(t, ok, "env %s is set to %q", name, v)
					continue
				}
				assert.Equal(t, want, v, "env %s", name)
			}
			for name, items := range tc.items {
				v := volume(pod, name)
				if items == nil {
					assert.Nil(t, v, "volume %s", name)
					continue
				}
				require.NotNil(t, v, "volume %s", name)
				require.NotNil(t, v.Secret, "volume %s", name)
				assert.Equal(t, items, v.Secret.Items, "volume %s", name)
				// Only the job container checks out, so only it mounts the Secret, read-only.
				var mounts []corev1.VolumeMount
				for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
					for _, m := range c.VolumeMounts {
						if m.Name == name {
							assert.Equal(t, podcontract.JobContainer, c.Name, "volume %s", name)
							mounts = append(mounts, m)
						}
					}
				}
				require.Len(t, mounts, 1, "volume %s", name)
				assert.True(t, mounts[0].ReadOnly, "volume %s", name)
			}
			checkInvariants(t, job, env, pod)
		})
	}
}

// The Secrets' file mode lets the job's user read them, and ssh take the key, whoever the
// job runs as.
func TestGitSecretModes(t *testing.T) {
	cases := []struct {
		name  string
		level PodSecurityLevel
		set   func(*bkv1.BuildEnvironmentSpec)
		want  int32
	}{
		{name: "restricted: uid and fsGroup 1000, read through the group", level: PodSecurityRestricted, want: 0o400},
		{name: "a user of the environment's with its fsGroup", level: PodSecurityRestricted, want: 0o400,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr(int64(1001)), FSGroup: ptr(int64(1001))}
			}},
		{name: "a user of the environment's without an fsGroup: readable by all, owned by root", level: PodSecurityRestricted, want: 0o444,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr(int64(1001))}
			}},
		{name: "the job container's own user", level: PodSecurityRestricted, want: 0o444,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(2000))}
			}},
		{name: "baseline, the image's user", level: PodSecurityBaseline, want: 0o400},
		{name: "root", level: PodSecurityPrivileged, want: 0o400,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(0))}
				s.Allow.RunAsRoot = true
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			env.Spec.Git = bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key"}, CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https"}}
			env.Spec.Allow.Secrets = []string{"deploy-key", "git-https"}
			if tc.set != nil {
				tc.set(&env.Spec)
			}
			pod, err := Build(baseJob(), env, Options{PodSecurity: tc.level})
			require.NoError(t, err)
			for _, name := range []string{podcontract.GitSSHVolume, podcontract.GitCredentialsVolume} {
				v := volume(pod, name)
				require.NotNil(t, v, name)
				assert.Equal(t, ptr(tc.want), v.Secret.DefaultMode, "%s: %#o", name, *v.Secret.DefaultMode)
			}
		})
	}
}
