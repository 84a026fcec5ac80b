package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// gitRepo makes a repository with two commits on main and one on a branch "feature", and
// returns its path and the commits by name.
func gitRepo(t *testing.T) (string, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	git := func(args ...string) string {
		out, err := gitrepo.Git(dir, args...)
		require.NoError(t, err)
		return out
	}
	commit := func(content string) string {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "hello.txt"), []byte(content+"\n"), 0o644))
		git("add", "hello.txt")
		git("commit", "-q", "-m", content)
		return git("rev-parse", "HEAD")
	}
	git("init", "-q", "-b", "main")
	commits := map[string]string{"first": commit("first version")}
	commits["second"] = commit("second version")
	git("checkout", "-q", "-b", "feature")
	commits["feature"] = commit("feature version")
	git("checkout", "-q", "main")
	return dir, commits
}

func TestCheckout(t *testing.T) {
	repo, commits := gitRepo(t)
	tests := []struct {
		name           string
		commit, branch string
		want           string
	}{
		{name: "a commit on the default branch", commit: commits["first"], branch: "main", want: "first version"},
		{name: "HEAD of a branch", commit: "HEAD", branch: "feature", want: "feature version"},
		{name: "HEAD of main", commit: "HEAD", branch: "main", want: "second version"},
		{name: "a commit on another branch", commit: commits["feature"], branch: "feature", want: "feature version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
				PipelineYAML: pipeline("cat hello.txt; git rev-parse HEAD"),
				Repo:         repo, Commit: tt.commit, Branch: tt.branch,
			})
			h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
			require.Equal(t, 0, h.start("--finish").wait(t, 30*time.Second))
			log := string(stripTimestamps(t, h.snapshot().Log))
			t.Logf("log:\n%s", log)
			assert.True(t, strings.HasPrefix(log, "~~~ Preparing working directory\n"), "log:\n%s", log)
			assert.Contains(t, log, "$ git fetch")
			assert.Contains(t, log, "~~~ Running commands\n$ cat hello.txt; git rev-parse HEAD\n"+tt.want+"\n")
			if tt.commit != "HEAD" {
				assert.Contains(t, log, tt.want+"\n"+tt.commit+"\n", "the exact commit is checked out")
			}
		})
	}
}

func TestCheckoutFailureFailsTheJob(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "no-such-repo")
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline("echo must not run"),
		Repo:         repo, Commit: "HEAD", Branch: "main",
	})
	code := h.start("--finish").wait(t, 30*time.Second)
	assert.NotZero(t, code)
	snap := h.snapshot()
	assert.NotEqual(t, "0", snap.ExitStatus)
	log := fakebuildkite.PlainLog(snap.Log)
	t.Logf("log:\n%s", log)
	assert.Contains(t, log, "~~~ Preparing working directory")
	assert.Contains(t, log, "🚨 Error: checking out "+repo+" failed (git exited with status 128)")
	assert.NotContains(t, log, "must not run\n")
	assert.NotContains(t, log, "Running commands")
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://x-access-token:ghs_secret@github.com/org/repo.git", "https://x-access-token:xxxxx@github.com/org/repo.git"},
		{"https://ghp_secret@github.com/org/repo.git", "https://xxxxx@github.com/org/repo.git"},
		{"git@github.com:org/repo.git", "git@github.com:org/repo.git"},
		{"ssh://git@github.com/org/repo.git", "ssh://git@github.com/org/repo.git"},
		{"/srv/repo", "/srv/repo"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, redactURL(tt.in), tt.in)
	}
}
