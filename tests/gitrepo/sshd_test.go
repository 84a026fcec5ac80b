package gitrepo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// StartSSHD's server lets its key in and no other, checks out as a known_hosts line says,
// and leaves nothing running once the test that started it ends, not even a session still
// open then.
func TestStartSSHD(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: sshd logs users in")
	}
	if !HaveSSHD() {
		t.Skip("no sshd on this machine (apt-get install openssh-server)")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this machine (apt-get install git)")
	}
	_, hadRunSSHD := os.Stat("/run/sshd")

	dir := t.TempDir()
	src, bare := filepath.Join(dir, "src"), filepath.Join(dir, "repo.git")
	require.NoError(t, WriteFiles(src, map[string]string{"f": "x\n"}, 0o644))
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "one"}} {
		_, err := Git(src, args...)
		require.NoError(t, err)
	}
	commit, err := Git(src, "rev-parse", "HEAD")
	require.NoError(t, err)
	_, err = Git(dir, "clone", "-q", "--bare", src, bare)
	require.NoError(t, err)

	key, pub, err := NewSSHKey("test")
	require.NoError(t, err)
	other, _, err := NewSSHKey("other")
	require.NoError(t, err)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, data, 0o600))
		return p
	}
	keyFile, otherFile := write("key", key), write("other", other)

	var session *exec.Cmd
	var sshdPID int
	t.Run("serves", func(t *testing.T) {
		s := StartSSHD(t, "127.0.0.1", pub)
		sshdPID = s.pid
		knownHosts := write("known_hosts", []byte(s.KnownHosts+"\n"))
		sshCommand := func(key string) string {
			return "ssh -i " + key + " -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile=" + knownHosts + " -o StrictHostKeyChecking=yes"
		}
		lsRemote := func(key string) (string, error) {
			cmd := exec.Command("git", "ls-remote", s.URL(bare), "refs/heads/main")
			cmd.Env = append(os.Environ(), "GIT_SSH_COMMAND="+sshCommand(key), "GIT_CONFIG_GLOBAL=/dev/null")
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		out, err := lsRemote(keyFile)
		require.NoError(t, err, "%s\nsshd's log:\n%s", out, s.Log())
		assert.Equal(t, commit+"\trefs/heads/main", strings.TrimSpace(out))
		assert.Contains(t, s.Log(), "Accepted publickey for root")

		out, err = lsRemote(otherFile)
		require.Error(t, err, "%s", out)
		assert.Contains(t, out, "Permission denied (publickey)")

		// A session still open when the test ends: its processes must not outlive sshd.
		session = exec.Command("ssh", append(strings.Fields(sshCommand(keyFile))[1:], "-p", strconv.Itoa(s.Port), "root@127.0.0.1", "sleep 3141")...)
		var log bytes.Buffer
		session.Stdout, session.Stderr = &log, &log
		require.NoError(t, session.Start())
		require.Eventually(t, func() bool { return len(sleepers()) > 0 }, 10*time.Second, 50*time.Millisecond,
			"the session's command did not start: %s\nsshd's log:\n%s", &log, s.Log())
	})
	require.NotZero(t, sshdPID)
	assert.NoDirExists(t, filepath.Join("/proc", strconv.Itoa(sshdPID)), "sshd still runs")
	assert.Empty(t, sleepers(), "the session's command still runs")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- session.Wait() }()
	select {
	case <-done: // the server went away: the client's connection ended
	case <-ctx.Done():
		_ = session.Process.Kill()
		t.Error("the ssh client's session did not end with sshd")
	}
	// Unless another test's sshd still runs (go test runs packages at once), which keeps it.
	run, err := os.Open("/run")
	require.NoError(t, err)
	defer func() { _ = run.Close() }()
	if syscall.Flock(int(run.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		_, hasRunSSHD := os.Stat("/run/sshd")
		assert.Equal(t, hadRunSSHD == nil, hasRunSSHD == nil, "/run/sshd is as it was")
	}
}

// sleepers are the processes running the test session's `sleep 3141`.
func sleepers() []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == "sleep\x003141\x00" {
			found = append(found, e.Name())
		}
	}
	return found
}
