package images

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// The job image's git reaches a private repository over SSH as a job pod's git does: run in
// the image's files (chrooted), as the pods' user, uid 1000, with no HOME it may write, and
// the ssh settings a BuildEnvironment's spec.git.sshSecret gives, against a throwaway sshd
// on this machine. ssh needs the image's passwd entry for the uid ("No user exists for uid
// 1000") and its own libraries.
func TestJobImageClonesOverSSHAsThePodsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chroot, another user, and sshd")
	}
	if !gitrepo.HaveSSHD() {
		t.Skip("no sshd on this machine (apt-get install openssh-server)")
	}
	agent := testkit.RequireAgent(t)
	out, err := BuildJob(context.Background(), t.TempDir(), agent)
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, os.Chmod(root, 0o755))
	extract(t, readTarball(t, out, JobImage), root)
	// The /dev/null a container runtime gives every container, which git and ssh open.
	devNull := filepath.Join(root, "dev", "null")
	require.NoError(t, os.MkdirAll(filepath.Dir(devNull), 0o755))
	require.NoError(t, syscall.Mknod(devNull, syscall.S_IFCHR|0o666, 1<<8|3)) // major 1, minor 3
	require.NoError(t, os.Chmod(devNull, 0o666))

	// The repository, on the host, where sshd's git-upload-pack finds it.
	dir := t.TempDir()
	bare, commit, err := gitrepo.Bare(dir, map[string]string{"f": "x\n"})
	require.NoError(t, err)

	key, pub, err := gitrepo.NewSSHKey("job image")
	require.NoError(t, err)
	sshd := gitrepo.StartSSHD(t, "127.0.0.1", pub)
	// The Secret's files, as a pod with an fsGroup has them: root's, readable by the group.
	uid := uint32(podbuilder.DefaultRestrictedUser)
	secrets := filepath.Join(root, "secrets")
	require.NoError(t, os.Mkdir(secrets, 0o755))
	for name, data := range map[string]string{"key": string(key), "known_hosts": sshd.KnownHosts + "\n"} {
		p := filepath.Join(secrets, name)
		require.NoError(t, os.WriteFile(p, []byte(data), 0o440))
		require.NoError(t, os.Chown(p, 0, int(uid)))
	}

	cmd := exec.Command("/usr/bin/git", "ls-remote", sshd.URL(bare), "refs/heads/main")
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/nonexistent",
		"GIT_SSH_COMMAND=ssh -i /secrets/key -o IdentitiesOnly=yes -o UserKnownHostsFile=/secrets/known_hosts -o StrictHostKeyChecking=yes",
	}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{uid}}}
	got, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", got)
	assert.Equal(t, commit+"\trefs/heads/main", strings.TrimSpace(string(got)))
}
