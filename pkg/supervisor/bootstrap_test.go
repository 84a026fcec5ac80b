package supervisor

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// socketsDir is a folder for the agent's sockets whose path is short. bootstrap (v3.138)
// serves the Job API on a unix socket, $BUILDKITE_SOCKETS_PATH/job-api/<pid>-<n>.sock, and
// fails the job when that path is longer than a unix socket's 108 bytes, as it is under a
// test's workspace, t.TempDir(), named after the test. (In a pod, the pod builder's
// /workspace/.buildkite-agent/sockets is short.)
func socketsDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bk-sockets-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// agentBinDir is a folder holding the real buildkite-agent (`make agent-binary`), for the
// job's PATH, or skips the test without it.
func agentBinDir(t *testing.T) string {
	t.Helper()
	bin := testkit.AgentOrSkip(t)
	// The supervisor finds the agent on the job's PATH by the name images give it.
	dir := t.TempDir()
	require.NoError(t, os.Symlink(bin, filepath.Join(dir, "buildkite-agent")))
	return dir
}

func TestBootstrapRunner(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	tests := []struct {
		name     string
		command  string
		wantCode int
		wantLog  []string
		wantMeta map[string]string
		env      map[string]string
		notLog   []string
	}{
		{
			name:     "checkout, meta-data and the command, as on any agent",
			command:  "buildkite-agent meta-data set from-the-pod yes && cat hello.txt",
			wantLog:  []string{"Preparing working directory", "first version"},
			wantMeta: map[string]string{"from-the-pod": "yes"},
		},
		{
			name:     "the command's exit status",
			command:  "echo failing; exit 3",
			wantCode: 3,
			wantLog:  []string{"failing", "The command exited with status 3"},
		},
		{
			name:    "an image without bash runs the command under /bin/sh",
			command: `echo "shell is $BUILDKITE_SHELL"`,
			env:     map[string]string{testDefaultShellEnv: "/no/such/bash"},
			wantLog: []string{"This image has no /no/such/bash: commands and hooks run under /bin/sh -e -c", "shell is /bin/sh -e -c"},
		},
		{
			name:    "BUILDKITE_SHELL chosen by the environment is kept",
			command: `echo "shell is $BUILDKITE_SHELL"`,
			env:     map[string]string{testDefaultShellEnv: "/no/such/bash", "BUILDKITE_SHELL": "/bin/sh -c"},
			wantLog: []string{"shell is /bin/sh -c"},
			notLog:  []string{"This image has no"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
				PipelineYAML: pipeline(tt.command), Repo: repo, Commit: commits["first"], Branch: "main",
			})
			h.env[podcontract.EnvRunner] = string(bkv1.RunnerBootstrap)
			h.env["PATH"] = binDir + ":" + os.Getenv("PATH")
			h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
			for k, v := range tt.env {
				h.env[k] = v
			}
			code := h.start("--finish").wait(t, time.Minute)
			snap := h.snapshot()
			log := fakebuildkite.PlainLog(snap.Log)
			t.Logf("log:\n%s", log)
			assert.Equal(t, tt.wantCode, code)
			for _, want := range tt.wantLog {
				assert.Contains(t, log, want)
			}
			for _, unwanted := range tt.notLog {
				assert.NotContains(t, log, unwanted)
			}
			build, ok := h.s.Build(snap.BuildID)
			require.True(t, ok)
			for k, v := range tt.wantMeta {
				assert.Equal(t, v, build.MetaData[k])
			}
			_, err := os.Stat(filepath.Join(h.ws, "build"))
			assert.NoError(t, err, "the checkout is under the workspace")
		})
	}
}
