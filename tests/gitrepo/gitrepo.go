// Package gitrepo makes git repositories on the host for the tests: checkouts, repository
// hooks and plugins that buildkite-agent bootstrap clones by path, and a throwaway sshd
// (StartSSHD) that serves them to a key, as a private repository is served.
package gitrepo

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Git runs git in dir with a fixed identity and without the user's configuration, and
// returns its output, trimmed.
func Git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.invalid",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.invalid", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// WriteFiles writes each file (a path relative to dir, its content) with mode, making the
// folders it needs.
func WriteFiles(dir string, files map[string]string, mode os.FileMode) error {
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			return err
		}
	}
	return nil
}

// GreeterPlugin makes a Buildkite plugin repository, branch main, at dir: an environment
// hook that exports GREETING from the plugin's `name` option, and a command hook that prints
// it. Steps refer to it as `<dir>#main`.
func GreeterPlugin(dir string) error {
	if err := WriteFiles(dir, map[string]string{
		"plugin.yml":        "name: greeter\ndescription: says hello\nconfiguration:\n  properties:\n    name: {type: string}\n",
		"hooks/environment": "#!/bin/sh\nexport GREETING=\"hello $BUILDKITE_PLUGIN_GREETER_NAME\"\necho \"greeter environment hook: $GREETING\"\n",
		"hooks/command":     "#!/bin/sh\necho \"greeter command hook: GREETING=$GREETING\"\n",
	}, 0o755); err != nil {
		return fmt.Errorf("writing the greeter plugin: %w", err)
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "greeter"}} {
		if _, err := Git(dir, args...); err != nil {
			return err
		}
	}
	return nil
}

// Bare makes, under dir, a bare repository of one commit holding files (each 0644), as a
// server holds a repository, and returns its path and the commit.
func Bare(dir string, files map[string]string) (bare, commit string, err error) {
	src := filepath.Join(dir, "src")
	bare = filepath.Join(dir, "repo.git")
	if err := WriteFiles(src, files, 0o644); err != nil {
		return "", "", err
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-q", "-m", "the one commit"}} {
		if _, err := Git(src, args...); err != nil {
			return "", "", err
		}
	}
	if commit, err = Git(src, "rev-parse", "HEAD"); err != nil {
		return "", "", err
	}
	if _, err := Git(dir, "clone", "-q", "--bare", src, bare); err != nil {
		return "", "", err
	}
	return bare, commit, nil
}
