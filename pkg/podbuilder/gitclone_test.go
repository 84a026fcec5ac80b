package podbuilder

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// These tests run the real git (and ssh) with the very settings Build gives a job's pod for
// spec.git, as the job's user (not root), with a HOME that does not exist, against a
// throwaway sshd and an https git server on this machine: the checkout of a private
// repository works as the pod has it, and fails where it should (a host key not in
// known_hosts, the wrong password, a server the credentials are not for). Where it works,
// the real `buildkite-agent bootstrap --phases checkout` (when `make agent-binary` has
// built it) checks out again with the job container's whole env. Files are laid out as
// the kubelet lays out a Secret volume: owned by root, group fsGroup when the pod has one,
// with the mode Build asks for (the kubelet adds group read for an fsGroup). They need root
// (to run as another user and to start sshd) and skip without it.

// gitWorld is what the clone tests share: a repository with one commit, served over SSH
// and https, and the job's user.
type gitWorld struct {
	dir       string // a scratch folder every user can enter
	repo      string // the bare repository
	commit    string // its one commit
	sshURL    string // "" when sshd is missing
	hostKey   string // the sshd's public host key line for known_hosts
	clientKey []byte // the private key sshd lets in
	httpsURL  string // https://127.0.0.1:port, the repository at /repo.git
	caFile    string // the https server's certificate
	user      jobUser
	// agent is the real buildkite-agent ("" when not built), and agentAPI a stand-in of
	// Buildkite's agent API for what its checkout asks (the commit's meta-data).
	agent    string
	agentAPI string
}

// jobUser runs the clones: uid 1000 (restricted's default) where it has an /etc/passwd
// entry, which ssh needs ("No user exists for uid"), else the nobody user.
type jobUser struct {
	uid, gid uint32
}

const (
	httpsUser     = "ci-bot"
	httpsPassword = "s3cr3t:@token" // characters a git-credentials file must percent-encode
)

func TestGitCloneWithPodSettings(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: clones run as the job's user, and the SSH server is started as root")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on this machine (apt-get install git)")
	}
	w := newGitWorld(t)

	type layout struct {
		// fsGroup: the pod has one (restricted's default); else the job names its user.
		fsGroup bool
		// ownKey lays the key out as the job user's own file (what Build must avoid).
		ownKey bool
		// knownHosts is the Secret's known_hosts content; "" for no knownHostsKey.
		knownHosts string
		// credentials is the Secret's git-credentials file, or the username and password.
		credentials, username, password string
	}
	cases := []struct {
		name string
		git  bkv1.GitSettings
		lay  func(w *gitWorld) layout
		// https clones w.httpsURL, else w.sshURL.
		https bool
		// want is in the output of a clone that must work; wantErr of one that must fail.
		want, wantErr string
		// notWant must not be in the output.
		notWant []string
	}{{
		name:    "SSH, known_hosts, restricted's fsGroup",
		git:     bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}},
		lay:     func(w *gitWorld) layout { return layout{fsGroup: true, knownHosts: w.hostKey} },
		notWant: []string{"Permanently added", "WARNING"},
	}, {
		name: "SSH, known_hosts, the job's own user without an fsGroup",
		git:  bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}},
		lay:  func(w *gitWorld) layout { return layout{knownHosts: w.hostKey} },
	}, {
		name: "SSH without known_hosts: the host key is taken, and the log says so",
		git:  bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KeyKey: "id_ed25519"}},
		lay:  func(*gitWorld) layout { return layout{fsGroup: true} },
		want: "Permanently added",
	}, {
		name:    "SSH, a server whose key known_hosts does not list",
		git:     bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}},
		lay:     func(w *gitWorld) layout { return layout{fsGroup: true, knownHosts: otherHostKey(t, w)} },
		wantErr: "Host key verification failed",
	}, {
		// Why Build leaves the key root's: ssh refuses a key of one's own that others can read.
		name:    "SSH, a key of the job user's own, group-readable",
		git:     bkv1.GitSettings{SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}},
		lay:     func(w *gitWorld) layout { return layout{fsGroup: true, ownKey: true, knownHosts: w.hostKey} },
		wantErr: "UNPROTECTED PRIVATE KEY FILE",
	}, {
		name:  "https, a git-credentials file",
		git:   bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https"}},
		https: true,
		lay: func(w *gitWorld) layout {
			return layout{fsGroup: true, credentials: credentialsLine(w.httpsURL, httpsUser, httpsPassword)}
		},
		// git's own credential-store would try to rewrite the read-only file after the fetch.
		notWant: []string{"fatal", "credential storage lock"},
	}, {
		name:  "https, a username and password for the server, without an fsGroup",
		git:   bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https", URL: "https://127.0.0.1"}},
		https: true,
		lay:   func(*gitWorld) layout { return layout{username: httpsUser, password: httpsPassword} },
	}, {
		name:  "https, the wrong password",
		git:   bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https"}},
		https: true,
		lay: func(w *gitWorld) layout {
			return layout{fsGroup: true, credentials: credentialsLine(w.httpsURL, httpsUser, "wrong")}
		},
		wantErr: "Authentication failed",
	}, {
		name:  "https, credentials for another server",
		git:   bkv1.GitSettings{CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https", URL: "https://git.example.com"}},
		https: true,
		lay:   func(*gitWorld) layout { return layout{fsGroup: true, username: httpsUser, password: httpsPassword} },
		// With no credentials and no terminal, git cannot ask for a username.
		wantErr: "terminal prompts disabled",
	}}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := w.sshURL
			if tc.https {
				url = w.httpsURL + "/repo.git"
			} else if url == "" {
				t.Skip("no sshd on this machine (apt-get install openssh-server)")
			}
			lay := tc.lay(w)
			env := baseEnv()
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Git = tc.git
			env.Spec.Allow.Secrets = []string{"deploy-key", "git-https"}
			if tc.git.CredentialsSecret != nil && tc.git.CredentialsSecret.URL != "" {
				// The server of the test has a port of its own.
				env.Spec.Git.CredentialsSecret = &bkv1.GitCredentialsSecret{Name: "git-https",
					URL: strings.Replace(tc.git.CredentialsSecret.URL, "https://127.0.0.1", w.httpsURL, 1)}
			}
			uid, gid := int64(w.user.uid), int64(w.user.gid)
			env.Spec.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &gid}
			if lay.fsGroup {
				env.Spec.PodSecurityContext.FSGroup = &gid
			}
			job := baseJob()
			job.Spec.Env = map[string]string{"BUILDKITE_REPO": url, "BUILDKITE_COMMIT": w.commit, "BUILDKITE_BRANCH": "main",
				"BUILDKITE_AGENT_NAME": "bk-operator-1", "BUILDKITE_ORGANIZATION_SLUG": "acme", "BUILDKITE_PIPELINE_SLUG": "private",
				"BUILDKITE_PIPELINE_PROVIDER": "git", "BUILDKITE_JOB_ID": jobID}
			pod, err := Build(job, env, Options{PodSecurity: PodSecurityRestricted, AgentEndpoint: w.agentAPI})
			require.NoError(t, err)

			// The Secret volumes, as the kubelet would write them.
			root := filepath.Join(w.dir, "pod"+strconv.Itoa(i))
			mkdirAll(t, root, 0o755)
			// The checkout's folder is the job's (the pod's workspace).
			require.NoError(t, os.Chown(root, int(w.user.uid), int(w.user.gid)))
			mounts := map[string]string{}
			for _, v := range pod.Spec.Volumes {
				if v.Secret == nil {
					continue
				}
				var dir string
				data := map[string][]byte{}
				switch v.Name {
				case podcontract.GitSSHVolume:
					dir = podcontract.GitSSHDir
					data[tc.git.SSHSecret.PrivateKeyKey()] = w.clientKey
					if k := tc.git.SSHSecret.KnownHostsKey; k != "" {
						data[k] = []byte(lay.knownHosts)
					}
				case podcontract.GitCredentialsVolume:
					dir = podcontract.GitCredentialsDir
					c := env.Spec.Git.CredentialsSecret
					if k := c.FileKey(); k != "" {
						data[k] = []byte(lay.credentials)
					} else {
						u, p := c.UsernameAndPasswordKeys()
						data[u], data[p] = []byte(lay.username), []byte(lay.password)
					}
				default:
					continue
				}
				local := filepath.Join(root, filepath.Base(dir))
				mounts[dir] = local
				writeSecretVolume(t, local, v.Secret, data, pod.Spec.SecurityContext.FSGroup)
				if lay.ownKey && v.Name == podcontract.GitSSHVolume {
					require.NoError(t, os.Chown(filepath.Join(local, podcontract.GitSSHKeyFile), int(w.user.uid), int(w.user.gid)))
				}
			}

			// The job container's env as the kubelet gives it, with the pod's paths where
			// this test has them: the Secrets' files, the workspace, the agent.
			workspace := filepath.Join(root, "workspace")
			mkdirAll(t, workspace, 0o755)
			require.NoError(t, os.Chown(workspace, int(w.user.uid), int(w.user.gid)))
			mounts[podcontract.WorkspaceDir] = workspace
			mounts[podcontract.BinDir] = filepath.Dir(w.agent)
			var gitEnv, podEnv []string
			secret := map[string]string{job.Spec.TokenSecretRef.KeyOrDefault(): "fake-job-token"}
			for name, value := range containerEnv(t, pod.Spec.Containers[0], secret) {
				for dir, local := range mounts {
					value = strings.ReplaceAll(value, dir, local)
				}
				podEnv = append(podEnv, name+"="+value)
				if strings.HasPrefix(name, "GIT_") {
					gitEnv = append(gitEnv, name+"="+value)
				}
			}
			require.NotEmpty(t, gitEnv, "the pod has no git settings")

			dest := filepath.Join(root, "checkout")
			out, err := w.runAsJob(gitEnv, "git", "clone", url, dest)
			if tc.wantErr != "" {
				require.Error(t, err, "the clone worked:\n%s", out)
				assert.Contains(t, out, tc.wantErr)
				return
			}
			require.NoError(t, err, "git clone %s:\n%s\nenv: %q", url, out, gitEnv)
			if tc.want != "" {
				assert.Contains(t, out, tc.want)
			}
			for _, s := range tc.notWant {
				assert.NotContains(t, out, s)
			}
			head, err := w.runAsJob(nil, "git", "-C", dest, "rev-parse", "HEAD")
			require.NoError(t, err, "%s", head)
			assert.Equal(t, w.commit, strings.TrimSpace(head))

			// And as the job runs it: the agent's own checkout, with the whole env of the
			// job's container.
			if w.agent == "" {
				t.Log("no buildkite-agent built (make agent-binary): the agent's checkout is not tried")
				return
			}
			out, err = w.runAsJob(podEnv, w.agent, "bootstrap", "--phases", "checkout")
			require.NoError(t, err, "buildkite-agent bootstrap:\n%s", out)
			checkout := filepath.Join(workspace, podcontract.BuildSubdir, "bk-operator-1", "acme", "private")
			head, err = w.runAsJob(nil, "git", "-C", checkout, "rev-parse", "HEAD")
			require.NoError(t, err, "%s\nbootstrap:\n%s", head, out)
			assert.Equal(t, w.commit, strings.TrimSpace(head))
			notWant := append([]string{"credential storage lock"}, tc.notWant...)
			if tc.git.SSHSecret != nil {
				// No ssh-keyscan, which needs a HOME it may write, and whose known_hosts
				// ssh would not read.
				notWant = append(notWant, "ssh-keyscan", "known_hosts file")
			}
			for _, s := range notWant {
				assert.NotContains(t, out, s)
			}
		})
	}
}

// startAgentAPI answers what the agent's checkout asks Buildkite: whether the commit's
// meta-data is there (it is, so the checkout sends none).
func (w *gitWorld) startAgentAPI(t *testing.T) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/data/exists") {
			_, _ = rw.Write([]byte(`{"exists":true}`))
			return
		}
		_, _ = rw.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	w.agentAPI = srv.URL + "/v3"
}

// newGitWorld makes the repository, the job's user and the servers, each stopped and
// removed when the test ends.
func newGitWorld(t *testing.T) *gitWorld {
	t.Helper()
	dir, err := os.MkdirTemp("", "gitclone-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // the job's user enters it, and writes only its own folders
	w := &gitWorld{dir: dir, user: pickJobUser(t)}

	// A repository with one commit, made and served by root.
	w.repo = filepath.Join(dir, "repo.git")
	src := filepath.Join(dir, "src")
	for _, args := range [][]string{
		{"init", "-q", "--bare", w.repo},
		{"init", "-q", src},
		{"-C", src, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "private"},
		{"-C", src, "push", "-q", w.repo, "HEAD:refs/heads/main"},
		{"--git-dir", w.repo, "symbolic-ref", "HEAD", "refs/heads/main"},
	} {
		out, err := exec.Command("git", args...).CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
	out, err := exec.Command("git", "--git-dir", w.repo, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	w.commit = strings.TrimSpace(string(out))

	w.startHTTPS(t)
	w.startAgentAPI(t)
	// Without a built agent, the tests leave out the agent's own checkout (and say so).
	agent := testkit.AgentBinary()
	if _, err := os.Stat(agent); err == nil {
		// Where the job's user can run it: the pod's bin volume.
		w.agent = filepath.Join(dir, "bin", "buildkite-agent")
		mkdirAll(t, filepath.Dir(w.agent), 0o755)
		b, err := os.ReadFile(agent)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(w.agent, b, 0o755))
	}
	if gitrepo.HaveSSHD() {
		w.startSSHD(t)
	}
	return w
}

func pickJobUser(t *testing.T) jobUser {
	t.Helper()
	for _, id := range []string{strconv.FormatInt(DefaultRestrictedUser, 10), "65534"} {
		u, err := user.LookupId(id)
		if err != nil {
			continue
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		require.NoError(t, err)
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		return jobUser{uid: uint32(uid), gid: uint32(gid)}
	}
	t.Skip("no user 1000 or 65534 in /etc/passwd to run the clones as")
	return jobUser{}
}

// runAsJob runs a command as the job's user, in its groups as the kubelet makes them
// (the fsGroup among them), with a HOME it cannot write, and env added to a bare PATH.
func (w *gitWorld) runAsJob(env []string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = w.dir
	cmd.Env = append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/nonexistent",
		"GIT_SSL_CAINFO=" + w.caFile, // the test server's own certificate, which no image trusts
		"GIT_TERMINAL_PROMPT=0",      // no terminal in a pod: fail instead of waiting for one
	}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
		Uid: w.user.uid, Gid: w.user.gid, Groups: []uint32{w.user.gid},
	}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startHTTPS serves the repository with git's http-backend over TLS, to a client that
// gives httpsUser and httpsPassword (basic auth) only.
func (w *gitWorld) startHTTPS(t *testing.T) {
	t.Helper()
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		out, err := exec.Command("git", "--exec-path").Output()
		require.NoError(t, err)
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	git := &cgi.Handler{Path: backend, Root: "/", Env: []string{"GIT_PROJECT_ROOT=" + w.dir, "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != httpsUser || p != httpsPassword {
			rw.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(rw, "who are you?", http.StatusUnauthorized)
			return
		}
		git.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	w.httpsURL = srv.URL
	w.caFile = filepath.Join(w.dir, "ca.pem")
	require.NoError(t, os.WriteFile(w.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644))
}

// startSSHD starts the shared throwaway sshd (tests/gitrepo) on 127.0.0.1, letting in
// w.clientKey as root (the server's user, whose git-upload-pack serves the repository); it
// stops when the test ends.
func (w *gitWorld) startSSHD(t *testing.T) {
	t.Helper()
	key, pub, err := gitrepo.NewSSHKey("client")
	require.NoError(t, err)
	w.clientKey = key
	sshd := gitrepo.StartSSHD(t, "127.0.0.1", pub)
	w.hostKey = sshd.KnownHosts
	w.sshURL = sshd.URL(w.repo)
}

// otherHostKey is a known_hosts line for the test's server with a key it does not have.
func otherHostKey(t *testing.T, w *gitWorld) string {
	t.Helper()
	if w.hostKey == "" {
		return ""
	}
	_, pub, err := gitrepo.NewSSHKey("other")
	require.NoError(t, err)
	host, _, _ := strings.Cut(w.hostKey, " ")
	return host + " " + pub
}

// credentialsLine is a git-credentials file's line for a server, its user and password
// percent-encoded as git credential-store writes them.
func credentialsLine(server, username, password string) string {
	scheme, host, _ := strings.Cut(server, "://")
	esc := func(s string) string {
		return strings.NewReplacer("%", "%25", ":", "%3a", "@", "%40", "/", "%2f").Replace(s)
	}
	return fmt.Sprintf("%s://%s:%s@%s\n", scheme, esc(username), esc(password), host)
}

// writeSecretVolume writes a Secret volume's files as the kubelet does: each item's key
// to its path, owned by root, with the volume's defaultMode, and, with an fsGroup, group
// fsGroup and group read added (the kubelet's SetVolumeOwnership for a read-only volume).
func writeSecretVolume(t *testing.T, dir string, s *corev1.SecretVolumeSource, data map[string][]byte, fsGroup *int64) {
	t.Helper()
	mkdirAll(t, dir, 0o755)
	require.NotNil(t, s.DefaultMode, "Build sets the mode of the git Secrets")
	for _, item := range s.Items {
		content, ok := data[item.Key]
		require.True(t, ok, "the pod asks for key %q, which the test's Secret has not", item.Key)
		p := filepath.Join(dir, item.Path)
		require.NoError(t, os.WriteFile(p, content, 0o600))
		mode := os.FileMode(*s.DefaultMode)
		gid := 0
		if fsGroup != nil {
			mode |= 0o440
			gid = int(*fsGroup)
		}
		require.NoError(t, os.Chown(p, 0, gid))
		require.NoError(t, os.Chmod(p, mode))
	}
}

func mkdirAll(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, mode))
	require.NoError(t, os.Chmod(dir, mode))
}
