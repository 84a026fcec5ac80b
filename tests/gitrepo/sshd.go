package gitrepo

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// SSHDPath is the OpenSSH server StartSSHD runs (Debian's openssh-server).
const SSHDPath = "/usr/sbin/sshd"

// HaveSSHD says whether this machine has the OpenSSH server StartSSHD runs.
func HaveSSHD() bool {
	_, err := os.Stat(SSHDPath)
	return err == nil
}

// SSHD is a throwaway OpenSSH server started by StartSSHD: it lets one key in as root, whose
// git-upload-pack serves any repository on the host by its path.
type SSHD struct {
	// Host and Port are where it listens.
	Host string
	Port int
	// KnownHosts is its host key as a known_hosts line, "[host]:port ssh-ed25519 AAAA...":
	// ssh looks a server on a port other than 22 up under that name.
	KnownHosts string
	log        *testkit.SyncBuffer
	pid        int
}

// URL is the ssh:// URL of the repository at path (absolute) on this server, as root.
func (s *SSHD) URL(path string) string {
	return "ssh://root@" + net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) + path
}

// Log is what sshd has written so far: whom it let in or refused, and why.
func (s *SSHD) Log() string { return s.log.String() }

// StartSSHD starts sshd (as root: it must be, to log a user in) on host and a free port,
// with a fresh host key, letting in as root only the key whose authorized_keys line is
// authorizedKey (NewSSHKey's public half). When t ends, sshd and the sessions it forked are
// killed, sshd waited for, and its files removed; its log is shown if t failed.
func StartSSHD(t testing.TB, host, authorizedKey string) *SSHD {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("StartSSHD needs root: sshd logs users in")
	}
	// Removed by the testing package after the cleanup below has stopped sshd (cleanups run
	// last registered first).
	dir := t.TempDir()
	hostKey, hostPub, err := NewSSHKey("throwaway sshd")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		t.Helper()
		p := filepath.Join(dir, name)
		// 0600: sshd refuses a host key that others may read.
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hostKeyFile := write("host_key", hostKey)
	authorized := write("authorized_keys", []byte(strings.TrimSpace(authorizedKey)+"\n"))

	// A free port: the kernel picks one, and sshd takes it over once it is closed again.
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("finding a free port on %s: %v", host, err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	addr := net.JoinHostPort(host, strconv.Itoa(port))

	// Only this configuration is read, not /etc/ssh's: keys alone (no passwords, no PAM,
	// which would want the host's login setup), and StrictModes off because the files live
	// in a temporary folder whatever its parents' modes.
	config := write("sshd_config", fmt.Appendf(nil, `ListenAddress %s
HostKey %s
PidFile %s
AuthorizedKeysFile %s
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
LogLevel VERBOSE
`, addr, hostKeyFile, filepath.Join(dir, "sshd.pid"), authorized))

	usePrivsepDir(t)

	s := &SSHD{Host: host, Port: port, KnownHosts: fmt.Sprintf("[%s]:%d %s", host, port, strings.TrimSpace(hostPub)), log: &testkit.SyncBuffer{}}
	// -D: in the foreground, so that it is this process to stop; -e: its log on stderr.
	cmd := exec.Command(SSHDPath, "-D", "-e", "-f", config)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	// Should a session's process escape the kill below, Wait stops waiting for the log it
	// may hold open.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting sshd: %v", err)
	}
	s.pid = cmd.Process.Pid
	t.Cleanup(func() {
		// Its sessions first (each in a session of its own, beyond a process group's kill),
		// while they are still its children.
		for _, pid := range descendants(cmd.Process.Pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sshd's log (%s):\n%s", addr, s.Log())
		}
	})

	// Ready once it accepts connections.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not listen on %s: %v\nits log:\n%s", addr, err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// privsepDir is sshd's privilege separation folder, fixed when it is built. The
// openssh-server package makes it at boot, which a container never has.
const privsepDir = "/run/sshd"

// privsepMarker, in privsepDir, says that a test made the folder, to be removed again.
const privsepMarker = privsepDir + "/.made-by-go-test"

// usePrivsepDir makes privsepDir when it is missing, and removes it once the last sshd of
// the tests that run at once is gone: go test runs packages in parallel, and several start
// sshd, so the one that made the folder may end while another's sshd still needs it. Each
// holds a shared lock on /run (flock on the folder itself: no lock file is left behind) for
// as long as its sshd runs; only the last can then take it exclusively, and it removes the
// folder if a test made it. The cleanup is registered before sshd's, so it runs after sshd
// has stopped.
func usePrivsepDir(t testing.TB) {
	t.Helper()
	lock, err := os.Open(filepath.Dir(privsepDir))
	if err != nil {
		t.Fatal(err)
	}
	// Waits while another test removes the folder.
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		_ = lock.Close()
		t.Fatalf("locking %s: %v", lock.Name(), err)
	}
	t.Cleanup(func() {
		defer func() { _ = lock.Close() }()
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return // another test's sshd still runs
		}
		if _, err := os.Stat(privsepMarker); err == nil {
			_ = os.Remove(privsepMarker)
			_ = os.Remove(privsepDir)
		}
	})
	if _, err := os.Stat(privsepDir); os.IsNotExist(err) {
		if err := os.MkdirAll(privsepDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(privsepMarker, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// NewSSHKey makes an ed25519 key pair with ssh-keygen (openssh-client): the private key
// (OpenSSH format, no passphrase) and the public key's authorized_keys line, "ssh-ed25519
// AAAA... comment". Nothing of it is left on disk.
func NewSSHKey(comment string) (private []byte, public string, err error) {
	dir, err := os.MkdirTemp("", "sshkey-")
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	f := filepath.Join(dir, "key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", f).CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("ssh-keygen: %w: %s", err, out)
	}
	if private, err = os.ReadFile(f); err != nil {
		return nil, "", err
	}
	pub, err := os.ReadFile(f + ".pub")
	if err != nil {
		return nil, "", err
	}
	return private, strings.TrimSpace(string(pub)), nil
}

// descendants are the processes under pid: its children, theirs, and so on, read from
// /proc.
func descendants(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields
		// are counted from the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		out = append(out, queue[0])
		queue = append(queue, children[queue[0]]...)
	}
	return out
}
