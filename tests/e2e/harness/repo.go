package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// GitRepo is a git repository on the host with two commits, so that a checkout at the first one is told
// apart from one at the branch head.
type GitRepo struct {
	Dir           string
	First, Second string
}

// MakeRepo makes a repository in dir with two commits and a repository pre-command hook.
func MakeRepo(dir string) (GitRepo, error) {
	r := GitRepo{Dir: dir}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=e2e", "GIT_AUTHOR_EMAIL=e2e@example.invalid",
			"GIT_COMMITTER_NAME=e2e", "GIT_COMMITTER_EMAIL=e2e@example.invalid", "GIT_CONFIG_GLOBAL=/dev/null")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}
	write := func(name, content string, mode os.FileMode) error {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(content), mode)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	if _, err := git("init", "-q", "-b", "main"); err != nil {
		return r, err
	}
	// A repository hook, which buildkite-agent bootstrap runs before the command.
	if err := write(".buildkite/hooks/pre-command", "#!/bin/sh\necho \"repository pre-command hook ran at $(cat file.txt)\"\n", 0o755); err != nil {
		return r, err
	}
	if err := write("file.txt", "version one\n", 0o644); err != nil {
		return r, err
	}
	if _, err := git("add", "-A"); err != nil {
		return r, err
	}
	if _, err := git("commit", "-q", "-m", "first"); err != nil {
		return r, err
	}
	var err error
	if r.First, err = git("rev-parse", "HEAD"); err != nil {
		return r, err
	}
	if err := write("file.txt", "version two\n", 0o644); err != nil {
		return r, err
	}
	if _, err := git("commit", "-q", "-am", "second"); err != nil {
		return r, err
	}
	r.Second, err = git("rev-parse", "HEAD")
	return r, err
}
