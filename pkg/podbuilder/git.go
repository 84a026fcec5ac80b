package podbuilder

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// The files of spec.git's Secrets in the job container.
var (
	gitSSHKeyPath      = path.Join(podcontract.GitSSHDir, podcontract.GitSSHKeyFile)
	gitKnownHostsPath  = path.Join(podcontract.GitSSHDir, podcontract.GitKnownHostsFile)
	gitCredentialsPath = path.Join(podcontract.GitCredentialsDir, podcontract.GitCredentialsFile)
	gitUsernamePath    = path.Join(podcontract.GitCredentialsDir, podcontract.GitUsernameFile)
	gitPasswordPath    = path.Join(podcontract.GitCredentialsDir, podcontract.GitPasswordFile)
)

// The variables through which gitEnv hands spec.git to git and to the agent.
const (
	envSSHKeyscan       = "BUILDKITE_SSH_KEYSCAN"
	envGitSSHCommand    = "GIT_SSH_COMMAND"
	envGitConfigCount   = "GIT_CONFIG_COUNT"
	envGitConfigKey0    = "GIT_CONFIG_KEY_0"
	envGitConfigValue0  = "GIT_CONFIG_VALUE_0"
	gitCredentialHelper = "credential.helper"
)

// gitVolumes are the pod's volumes of spec.git's Secrets, each with only the keys git
// needs, under fixed file names. setGitSecretModes sets their file mode once the pod's users
// are known.
func gitVolumes(env *bkv1.BuildEnvironment) []corev1.Volume {
	g := &env.Spec.Git
	var volumes []corev1.Volume
	secret := func(name, secret string, items ...corev1.KeyToPath) {
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: secret,
			Items:      items,
		}}})
	}
	if s := g.SSHSecret; s != nil {
		items := []corev1.KeyToPath{{Key: s.PrivateKeyKey(), Path: podcontract.GitSSHKeyFile}}
		if s.KnownHostsKey != "" {
			items = append(items, corev1.KeyToPath{Key: s.KnownHostsKey, Path: podcontract.GitKnownHostsFile})
		}
		secret(podcontract.GitSSHVolume, s.Name, items...)
	}
	if c := g.CredentialsSecret; c != nil {
		if key := c.FileKey(); key != "" {
			secret(podcontract.GitCredentialsVolume, c.Name, corev1.KeyToPath{Key: key, Path: podcontract.GitCredentialsFile})
		} else {
			user, password := c.UsernameAndPasswordKeys()
			secret(podcontract.GitCredentialsVolume, c.Name,
				corev1.KeyToPath{Key: user, Path: podcontract.GitUsernameFile},
				corev1.KeyToPath{Key: password, Path: podcontract.GitPasswordFile})
		}
	}
	return volumes
}

// gitMounts are the job container's read-only mounts of spec.git's Secrets. Only the job
// container checks out, so no other container of the pod gets them.
func gitMounts(env *bkv1.BuildEnvironment) []corev1.VolumeMount {
	var mounts []corev1.VolumeMount
	if env.Spec.Git.SSHSecret != nil {
		mounts = append(mounts, corev1.VolumeMount{Name: podcontract.GitSSHVolume, MountPath: podcontract.GitSSHDir, ReadOnly: true})
	}
	if env.Spec.Git.CredentialsSecret != nil {
		mounts = append(mounts, corev1.VolumeMount{Name: podcontract.GitCredentialsVolume, MountPath: podcontract.GitCredentialsDir, ReadOnly: true})
	}
	return mounts
}

// gitEnv tells git (the checkout's, the plugins', and any the command runs) where spec.git's
// credentials are, through its environment alone: nothing is written to HOME, which may be
// any folder, or none the job's user may write, in a restricted namespace.
//
//   - SSH: GIT_SSH_COMMAND runs ssh with the mounted key only (IdentitiesOnly, not the
//     keys of an agent or of ~/.ssh) and the mounted known_hosts, against which the server's
//     key must match (StrictHostKeyChecking=yes). Without known_hosts, a server's key is
//     taken unverified and remembered nowhere (/dev/null), which is what the agent's
//     ssh-keyscan amounts to on a fresh pod. Either way ssh never reads what ssh-keyscan
//     would write to ~/.ssh/known_hosts, so BUILDKITE_SSH_KEYSCAN is turned off.
//   - https: a credential helper in git's configuration from the environment
//     (GIT_CONFIG_COUNT, GIT_CONFIG_KEY_n, GIT_CONFIG_VALUE_n, git 2.31 and later) that
//     answers git's requests from the mounted Secret. It answers "get" only: git's
//     credential-store, asked to "store" a credential after a successful fetch, would try to
//     rewrite the read-only file and print "fatal: unable to get credential storage lock"
//     into the job's log.
func gitEnv(env *bkv1.BuildEnvironment) []corev1.EnvVar {
	g := &env.Spec.Git
	var vars []corev1.EnvVar
	if s := g.SSHSecret; s != nil {
		knownHosts, check := "/dev/null", "accept-new"
		if s.KnownHostsKey != "" {
			knownHosts, check = gitKnownHostsPath, "yes"
		}
		vars = append(vars,
			literalEnv(envSSHKeyscan, "false"),
			literalEnv(envGitSSHCommand, fmt.Sprintf("ssh -i %s -o IdentitiesOnly=yes -o UserKnownHostsFile=%s -o StrictHostKeyChecking=%s",
				gitSSHKeyPath, knownHosts, check)))
	}
	if c := g.CredentialsSecret; c != nil {
		key, helper := gitCredentialHelper, ""
		if c.FileKey() != "" {
			helper = fmt.Sprintf(`!f() { [ "$1" = get ] || exit 0; exec git credential-store --file=%s get; }; f`, gitCredentialsPath)
		} else {
			// Scoped to the server: git gives the password to no other.
			key = "credential." + strings.TrimRight(c.URL, "/") + ".helper"
			helper = fmt.Sprintf(`!f() { [ "$1" = get ] || exit 0; printf 'username=%%s\npassword=%%s\n' "$(cat %s)" "$(cat %s)"; }; f`,
				gitUsernamePath, gitPasswordPath)
		}
		vars = append(vars,
			literalEnv(envGitConfigCount, "1"),
			literalEnv(envGitConfigKey0, key),
			literalEnv(envGitConfigValue0, helper))
	}
	return vars
}

// setGitSecretModes sets the file mode of spec.git's Secret volumes so that the job's user
// can read them and ssh takes the key: ssh refuses a key of the user's own that others may
// read ("UNPROTECTED PRIVATE KEY FILE"), but not one owned by someone else (the kubelet
// makes Secret files root's).
//
//   - With an fsGroup (a restricted namespace gives one unless the environment names its
//     own user): 0400, which the kubelet turns into 0440, group fsGroup, readable through
//     the group every container of the pod is in. A job that runs as root with an fsGroup
//     cannot use the SSH key: the kubelet's group bit makes root's own key too open for ssh.
//   - Without one, for a user other than root: 0444, owned by root, so the user can read it.
//   - Else (root, or the image's user): 0400, for root.
func setGitSecretModes(pod *corev1.Pod) {
	var fsGroup, user *int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		fsGroup, user = psc.FSGroup, psc.RunAsUser
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == podcontract.JobContainer && c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
			user = c.SecurityContext.RunAsUser
		}
	}
	mode := int32(0o400)
	if fsGroup == nil && user != nil && *user != 0 {
		mode = 0o444
	}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if (v.Name == podcontract.GitSSHVolume || v.Name == podcontract.GitCredentialsVolume) && v.Secret != nil {
			v.Secret.DefaultMode = ptr(mode)
		}
	}
}
