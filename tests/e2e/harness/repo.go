package harness

import (
	"os"

	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"
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
	git := func(args ...string) (string, error) { return gitrepo.Git(dir, args...) }
	write := func(name, content string, mode os.FileMode) error {
		return gitrepo.WriteFiles(dir, map[string]string{name: content}, mode)
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
