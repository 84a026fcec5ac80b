package supervisor

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestJobSeesWhatTheAgentSetsAtRunTime checks the part of the job's env that only the
// running supervisor can give, as `buildkite-agent start` gives it: its pid, the env file
// with the job's env as Buildkite sent it, BUILDKITE_PLUGINS even for a step without
// plugins, the shell, and the operator's buildkite-agent found through BUILDKITE_BIN_PATH
// when the image has none on its PATH.
func TestJobSeesWhatTheAgentSetsAtRunTime(t *testing.T) {
	const command = `echo "pid=$BUILDKITE_AGENT_PID"; echo "shell=$BUILDKITE_SHELL"; echo "plugins=${BUILDKITE_PLUGINS-unset}"; ` +
		`echo "env file:"; cat "$BUILDKITE_ENV_FILE"; echo "agent: $(buildkite-agent --version)"`
	tests := []struct {
		name   string
		runner bkv1.RunnerMode
		// binDir holds the buildkite-agent the job should find.
		binDir  func(t *testing.T) string
		wantLog []string
	}{
		{
			name:    "Command runner",
			runner:  bkv1.RunnerCommand,
			binDir:  standInAgent,
			wantLog: []string{"shell=/bin/sh -e -c", "agent: buildkite-agent stand-in"},
		},
		{
			name:    "Bootstrap runner, the operator's agent and none on the image's PATH",
			runner:  bkv1.RunnerBootstrap,
			binDir:  agentBinary,
			wantLog: []string{"shell=/bin/bash -e -c", "agent: buildkite-agent version 3.52.0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			binDir := tt.binDir(t)
			repo, commits := gitRepo(t)
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
				PipelineYAML: pipeline(command), Repo: repo, Commit: commits["first"], Branch: "main",
			})
			h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
			// The spawner drops BUILDKITE_PLUGINS when the operator's plugin was the only one.
			delete(h.job.Env, "BUILDKITE_PLUGINS")
			h.env[podcontract.EnvRunner] = string(tt.runner)
			h.env["BUILDKITE_BIN_PATH"] = binDir
			h.env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
			h.env[podcontract.EnvJobEnvNames] = "BUILDKITE_BRANCH,BUILDKITE_MESSAGE"
			h.job.Env["BUILDKITE_MESSAGE"] = "a \"quoted\"\nmessage"
			code := h.start("--finish").wait(t, time.Minute)
			log := fakebuildkite.PlainLog(h.snapshot().Log)
			t.Logf("log:\n%s", log)
			require.Equal(t, 0, code)
			assert.Regexp(t, regexp.MustCompile(`(?m)^pid=[0-9]+\r?$`), log)
			assert.Regexp(t, regexp.MustCompile(`(?m)^plugins=\r?$`), log, "BUILDKITE_PLUGINS is set, and empty")
			// The env file holds the job's env as Buildkite gave it, and nothing else.
			assert.Contains(t, log, `BUILDKITE_BRANCH="main"`)
			assert.Contains(t, log, `BUILDKITE_MESSAGE="a \"quoted\"\nmessage"`)
			assert.NotContains(t, log, `BUILDKITE_PIPELINE_SLUG="`)
			for _, want := range tt.wantLog {
				assert.Contains(t, log, want)
			}
			matches, err := filepath.Glob(filepath.Join(os.TempDir(), "job-env-"+h.job.ID+"*"))
			require.NoError(t, err)
			assert.Empty(t, matches, "the env file is removed once the job has ended")
		})
	}
}

// standInAgent is a folder with a buildkite-agent that only says what it is.
func standInAgent(t *testing.T) string {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "buildkite-agent"), []byte("#!/bin/sh\necho buildkite-agent stand-in\n"), 0o755))
	return dir
}

// TestAgentHooksRun checks that bootstrap runs the agent hooks in BUILDKITE_HOOKS_PATH (where
// the pod builder mounts a BuildEnvironment's hooks ConfigMap), and warns about the agent
// settings a step's env tried to set (BUILDKITE_IGNORED_ENV, from the pod builder).
func TestAgentHooksRun(t *testing.T) {
	binDir := agentBinary(t)
	repo, commits := gitRepo(t)
	hooks := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(hooks, "environment"),
		[]byte("#!/bin/sh\necho \"agent environment hook ran\"\nexport FROM_AGENT_HOOK=yes\n"), 0o755))
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(`echo "the command sees FROM_AGENT_HOOK=$FROM_AGENT_HOOK"`), Repo: repo, Commit: commits["first"], Branch: "main",
	})
	h.env[podcontract.EnvRunner] = string(bkv1.RunnerBootstrap)
	h.env["BUILDKITE_BIN_PATH"] = binDir
	h.env["BUILDKITE_HOOKS_PATH"] = hooks
	h.env["BUILDKITE_IGNORED_ENV"] = "BUILDKITE_GIT_CLONE_FLAGS"
	h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
	code := h.start("--finish").wait(t, time.Minute)
	log := fakebuildkite.PlainLog(h.snapshot().Log)
	t.Logf("log:\n%s", log)
	require.Equal(t, 0, code)
	assert.Contains(t, log, "agent environment hook ran")
	assert.Contains(t, log, "the command sees FROM_AGENT_HOOK=yes")
	assert.Contains(t, log, "Ignored BUILDKITE_GIT_CLONE_FLAGS")
}
