package supervisor

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// runCommand is the Command runner: a checkout of BUILDKITE_REPO when one is given, then the
// command under /bin/sh -e -c in the workspace. env is the job's (runtimeEnv).
func (j *job) runCommand(env []string) Result {
	ws := j.conf.Workspace
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return j.startFailed(fmt.Errorf("making the workspace: %w", err))
	}
	env = withBinPath(setDefaults(env, map[string]string{"BUILDKITE_BUILD_CHECKOUT_PATH": ws}))
	// Bootstrap sets it for the whole job: a git command of the step fails rather than waits
	// for a password nobody will type.
	env = append(env, "GIT_TERMINAL_PROMPT=0")
	for _, note := range j.notes {
		_ = j.stream.WriteLine(note)
	}
	if repo := lookup(env, "BUILDKITE_REPO"); repo != "" {
		_ = j.stream.WriteLine("~~~ Preparing working directory")
		p, ok, err := j.checkout(repo, env)
		if err != nil {
			return j.startFailed(err)
		}
		if !ok {
			if p != nil {
				status, _ := exitOf(p.status)
				_ = j.stream.WriteLine(fmt.Sprintf("🚨 Error: checking out %s failed (git exited with status %d): check the repository URL, the commit and the pod's access to the repository", redactURL(repo), status))
			}
			return j.result(p)
		}
	}
	_ = j.stream.WriteLine("~~~ Running commands")
	p, err := j.step(displayCommand(j.conf.Command), "/bin/sh", []string{"-e", "-c", j.conf.Command}, ws, env)
	if err != nil {
		return j.startFailed(err)
	}
	return j.result(p)
}

// withGitConfig returns env with git config entries (key, value, key, value, ...) added
// after those env already gives through GIT_CONFIG_COUNT (a private repository's
// credential helper, from the BuildEnvironment's spec.git), which a fresh count would
// hide from git.
func withGitConfig(env []string, kv ...string) []string {
	n, _ := strconv.Atoi(lookup(env, "GIT_CONFIG_COUNT"))
	out := make([]string, 0, len(env)+len(kv)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, "GIT_CONFIG_COUNT=") {
			out = append(out, e)
		}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", n, kv[i]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", n, kv[i+1]))
		n++
	}
	return append(out, "GIT_CONFIG_COUNT="+strconv.Itoa(n))
}

// displayCommand shows a (maybe multi-line) command as a shell transcript would.
func displayCommand(c string) string {
	return strings.ReplaceAll(strings.TrimRight(c, "\n"), "\n", "\n$ ")
}

// checkout fetches repo at BUILDKITE_COMMIT (or BUILDKITE_BRANCH when the commit is HEAD) into
// the workspace, which may already hold files (a sidecar's, or a previous attempt's). It
// reports ok=false with the failing step (nil when the job was stopped) when it did not work.
func (j *job) checkout(repo string, env []string) (p *process, ok bool, err error) {
	ws := j.conf.Workspace
	commit := lookup(env, "BUILDKITE_COMMIT")
	branch := lookup(env, "BUILDKITE_BRANCH")
	// The workspace volume is often owned by another user than the one the image runs as;
	// git refuses such a repository unless told it is safe. Config from the environment
	// counts as command-line config, which git honours for this setting.
	gitEnv := withGitConfig(env, "safe.directory", "*", "advice.detachedHead", "false")
	gitEnv = append(gitEnv, "GIT_TERMINAL_PROMPT=0")
	shown := redactURL(repo)
	git := func(args ...string) (*process, bool, error) {
		display := "git " + strings.Join(args, " ")
		display = strings.ReplaceAll(display, repo, shown)
		p, err := j.step(display, "git", args, ws, gitEnv)
		if err != nil || p == nil {
			return p, false, err
		}
		return p, p.succeeded(), nil
	}
	run := func(steps ...[]string) (*process, bool, error) {
		for _, args := range steps {
			if p, ok, err := git(args...); !ok {
				return p, false, err
			}
		}
		return nil, true, nil
	}

	if _, err := os.Stat(filepath.Join(ws, ".git")); err == nil {
		if p, ok, err := run([]string{"remote", "set-url", "origin", repo}); !ok {
			return p, false, err
		}
	} else if p, ok, err := run([]string{"init", "--quiet"}, []string{"remote", "add", "origin", repo}); !ok {
		return p, false, err
	}

	if commit == "" || commit == "HEAD" {
		ref := branch
		if ref == "" {
			ref = "HEAD"
		}
		return run([]string{"fetch", "-v", "--prune", "--", "origin", ref}, []string{"checkout", "-f", "FETCH_HEAD"})
	}
	// Fetch the commit itself when the server allows it; otherwise every branch and tag, as
	// the agent does.
	p, ok, err = git("fetch", "-v", "--prune", "--", "origin", commit)
	if err != nil || (!ok && p == nil) {
		return p, false, err
	}
	if !ok {
		if p, ok, err := run([]string{"fetch", "-v", "--prune", "--", "origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"}); !ok {
			return p, false, err
		}
	}
	return run([]string{"checkout", "-f", commit})
}

// redactURL hides a password or token in a repository URL before it is shown in the log.
func redactURL(repo string) string {
	u, err := url.Parse(repo)
	if err != nil || u.User == nil {
		return repo
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	} else if u.Scheme == "https" || u.Scheme == "http" {
		u.User = url.User("xxxxx")
	}
	return u.String()
}

// agentDefaultShell is the shell `buildkite-agent bootstrap` runs commands and hooks with when
// BUILDKITE_SHELL is unset ("/bin/bash -e -c"); fallbackShell is used instead when the image
// does not have it. A variable so that tests can point it at a missing file.
var agentDefaultShell = "/bin/bash"

const fallbackShell = "/bin/sh -e -c"

// runBootstrap is the Bootstrap runner: `buildkite-agent bootstrap`, the operator's (or the
// image's), with the paths an agent would give it. env is the job's (runtimeEnv): in a pod
// the pod builder has set the agent's paths already; run elsewhere, they default to folders
// of the workspace.
func (j *job) runBootstrap(env []string) Result {
	ws := j.conf.Workspace
	agent, err := findAgent(env)
	if err != nil {
		return j.startFailed(err)
	}
	// Made by the supervisor, as `buildkite-agent start` makes its own; the hooks folder is
	// the environment's or the image's, and need not exist.
	dirs := map[string]string{
		"BUILDKITE_BUILD_PATH":   filepath.Join(ws, podcontract.BuildSubdir),
		"BUILDKITE_PLUGINS_PATH": filepath.Join(ws, podcontract.PluginsSubdir),
		"BUILDKITE_SOCKETS_PATH": filepath.Join(ws, podcontract.SocketsSubdir),
	}
	defaults := map[string]string{
		envBinPath:             filepath.Dir(agent),
		"BUILDKITE_HOOKS_PATH": filepath.Join(ws, ".buildkite-agent", "hooks"),
	}
	for k, v := range dirs {
		defaults[k] = v
	}
	if lookup(env, "BUILDKITE_AGENT_NAME") == "" {
		name, _ := os.Hostname()
		if name == "" {
			name = "buildkite-operator"
		}
		defaults["BUILDKITE_AGENT_NAME"] = name
	}
	env = withRedactedVars(setDefaults(env, defaults))
	for k := range dirs {
		if err := os.MkdirAll(lookup(env, k), 0o755); err != nil {
			return j.startFailed(fmt.Errorf("making %s: %w", k, err))
		}
	}
	p, err := j.step("", agent, []string{"bootstrap"}, ws, env)
	if err != nil {
		return j.startFailed(err)
	}
	return j.result(p)
}

// lookPath finds file on the PATH of env (the job's, which may differ from the supervisor's).
func lookPath(file string, env []string) (string, error) {
	for _, dir := range filepath.SplitList(lookup(env, "PATH")) {
		if dir == "" {
			dir = "."
		}
		if p := filepath.Join(dir, file); isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", file, exec.ErrNotFound)
}

// lookup returns the value of name in env ("" when unset); the last setting wins, as in exec.
func lookup(env []string, name string) string {
	v, _ := lookupSet(env, name)
	return v
}

// setDefaults returns env with the variables of defaults that env does not set (or sets empty).
func setDefaults(env []string, defaults map[string]string) []string {
	out := append([]string(nil), env...)
	for k, v := range defaults {
		if lookup(env, k) == "" {
			out = append(out, k+"="+v)
		}
	}
	return out
}
