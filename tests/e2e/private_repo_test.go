package e2e

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// privateFile is the one file of the private repository, and what the job prints of it.
const privateFile = "only the deploy key opens this repository"

// TestPrivateRepositoryOverSSH checks a repository out over SSH with a BuildEnvironment's
// spec.git.sshSecret, as a user's private repository on GitHub is: no hostPath, only the
// key and known_hosts from a Secret. A throwaway sshd on the host, where the pods reach the
// fake Buildkite, serves a bare repository to that key alone; the job's bootstrap clones
// it, as uid 1000 with the job image's ssh, checking the server against known_hosts.
func TestPrivateRepositoryOverSSH(t *testing.T) {
	e := needEnv(t)
	if !gitrepo.HaveSSHD() {
		t.Skipf("no %s on this machine to serve the private repository from: apt-get install openssh-server (make node-deps)", gitrepo.SSHDPath)
	}
	ctx := context.Background()

	// The repository: one commit with one file, bare, root's (sshd's git-upload-pack runs
	// as root). It lives in the test's own folder, which no pod mounts.
	dir := t.TempDir()
	bare, commit, err := gitrepo.Bare(dir, map[string]string{"private.txt": privateFile + "\n"})
	require.NoError(t, err)

	// The server listens where the pods reach the host: the fake Buildkite's host (the local
	// node's bridge gateway), on a port of its own. It stops when the test ends.
	fake, err := url.Parse(e.Fake.URL())
	require.NoError(t, err)
	key, pub, err := gitrepo.NewSSHKey("e2e private repository")
	require.NoError(t, err)
	sshd := gitrepo.StartSSHD(t, fake.Hostname(), pub)

	// A Secret as `kubectl create secret generic --type=kubernetes.io/ssh-auth` makes it,
	// and an environment that gives it to its jobs, which spec.allow.secrets must allow.
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-git-ssh", Namespace: e.JobNamespace},
		Type:       corev1.SecretTypeSSHAuth,
		Data: map[string][]byte{
			corev1.SSHAuthPrivateKey: key,
			"known_hosts":            []byte(sshd.KnownHosts + "\n"),
		},
	}
	require.NoError(t, createOrReplace(ctx, e, secret))
	require.NoError(t, e.ApplyEnvironment(ctx, gen.BuildEnvironment("private-repo",
		gen.SetBuildEnvironmentImage(images.JobImage), gen.SetBuildEnvironmentImagePullPolicy(corev1.PullNever),
		gen.SetBuildEnvironmentRunner(bkv1.RunnerBootstrap),
		func(be *bkv1.BuildEnvironment) {
			be.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: secret.Name, KnownHostsKey: "known_hosts"}
			be.Spec.Allow.Secrets = []string{secret.Name}
		})))

	runCase(t, e, jobCase{
		name: "a private repository over SSH",
		pipeline: `steps:
  - command: echo "HEAD is $(git log -1 --format=%H)"; cat private.txt
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: private-repo
`,
		repo: sshd.URL(bare), commit: commit,
		state: fakebuildkite.StateFinished, exitStatus: "0",
		logHas: []string{"HEAD is " + commit, "\n" + privateFile},
		// known_hosts was used: ssh took no key unverified.
		logHasNot: []string{"Permanently added"},
		check: func(t *testing.T, _ *harness.Env, j fakebuildkite.JobSnapshot) {
			// The key is in a file of the pod, never in the log: no line of it, not even
			// its armour.
			log := fakebuildkite.PlainLog(j.Log)
			for _, line := range strings.Split(strings.TrimSpace(string(key)), "\n") {
				assert.NotContains(t, log, line, "the log shows the private key")
			}
			assert.Contains(t, sshd.Log(), "Accepted publickey for root", "the checkout came through the SSH server")
		},
	})
}
