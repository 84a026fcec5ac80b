package harness

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"
)

// PodUser is the uid job pods run as: the operator builds them for the restricted Pod
// Security level of the chart's job namespace, and their environments name no user.
const PodUser = int(podbuilder.DefaultRestrictedUser)

// GiveToPods makes everything under dir, a folder pods mount from the host, owned by the
// job pods' user, so that they can write to it and git trusts the repositories in it, and
// lets that user reach dir through its parent.
func GiveToPods(dir string) error {
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("opening %s to the pods' user: %w", filepath.Dir(dir), err)
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(p, PodUser, PodUser); err != nil {
			return fmt.Errorf("giving %s to the pods' user: %w", p, err)
		}
		return nil
	})
}

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
