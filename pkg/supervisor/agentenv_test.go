package supervisor

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"

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
		`echo "env file:"; cat "$BUILDKITE_ENV_FILE"; printf 'json env file: %s\n' "$(cat "$BUILDKITE_ENV_JSON_FILE")"; ` +
		`echo "timeout marker: $BUILDKITE_AGENT_JOB_TIMEOUT_FILE"; echo "agent: $(buildkite-agent --version)"`
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
			binDir:  agentBinDir,
			wantLog: []string{"shell=/bin/bash -e -c", "agent: buildkite-agent version 3.138.1"},
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
			log := runToPass(t, h)
			assert.Regexp(t, regexp.MustCompile(`(?m)^pid=[0-9]+\r?$`), log)
			assert.Regexp(t, regexp.MustCompile(`(?m)^plugins=\r?$`), log, "BUILDKITE_PLUGINS is set, and empty")
			// The env file holds the job's env as Buildkite gave it, and nothing else.
			assert.Contains(t, log, `BUILDKITE_BRANCH="main"`)
			assert.Contains(t, log, `BUILDKITE_MESSAGE="a \"quoted\"\nmessage"`)
			assert.NotContains(t, log, `BUILDKITE_PIPELINE_SLUG="`)
			// Set by the agent before it writes the files, so in them too.
			assert.Contains(t, log, `BUILDKITE_GIT_REMOTE_MIRROR_URL=""`)
			// Its JSON twin: the same, as json.Encoder writes it.
			assert.Contains(t, log, `json env file: {"BUILDKITE_BRANCH":"main","BUILDKITE_GIT_REMOTE_MIRROR_URL":"","BUILDKITE_MESSAGE":"a \"quoted\"\nmessage","BUILDKITE_PLUGINS":""}`)
			assert.Regexp(t, regexp.MustCompile(`(?m)^timeout marker: /.+/job-timeout-`+h.job.ID+`\r?$`), log)
			for _, want := range tt.wantLog {
				assert.Contains(t, log, want)
			}
			for _, pattern := range []string{"job-env-" + h.job.ID + "*", "job-env-json-" + h.job.ID + "*"} {
				matches, err := filepath.Glob(filepath.Join(os.TempDir(), pattern))
				require.NoError(t, err)
				assert.Empty(t, matches, "the env files are removed once the job has ended")
			}
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
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	hooks := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(hooks, "environment"),
		[]byte("#!/bin/sh\necho \"agent environment hook ran\"\nexport FROM_AGENT_HOOK=yes\n"), 0o755))
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(`echo "the command sees FROM_AGENT_HOOK=$FROM_AGENT_HOOK"`), Repo: repo, Commit: commits["first"], Branch: "main",
	})
	useBootstrap(h, binDir)
	h.env["BUILDKITE_HOOKS_PATH"] = hooks
	h.env["BUILDKITE_IGNORED_ENV"] = "BUILDKITE_GIT_CLONE_FLAGS"
	log := runToPass(t, h)
	assert.Contains(t, log, "agent environment hook ran")
	assert.Contains(t, log, "the command sees FROM_AGENT_HOOK=yes")
	assert.Contains(t, log, "Ignored BUILDKITE_GIT_CLONE_FLAGS")
}

// producerStep and consumerStep are two steps that share an artifact (artifact_paths) and
// meta-data, the second uploaded by the first (pipeline upload, with an annotation on the
// way). The e2e suite runs the same steps on real pods (queue bk-operator).
func producerStep(queue string) string {
	return `command: |
      mkdir -p out && echo "artifact made by the producer" > out/greeting.txt
      buildkite-agent meta-data set e2e-color blue
      buildkite-agent annotate "annotated by the producer" --style success --context e2e
      printf 'steps:\n  - label: consumer\n    command: "n=0; until buildkite-agent artifact download out/greeting.txt .; do n=$((n+1)); [ $n -lt 30 ] || exit 1; sleep 2; done; cat out/greeting.txt; echo color=$(buildkite-agent meta-data get e2e-color)"\n    agents: {queue: ` + queue + `}\n' | buildkite-agent pipeline upload --no-interpolation
    artifact_paths: out/*.txt
    agents: {queue: ` + queue + `}
`
}

// TestStepsShareArtifactsAndMetaData runs producerStep, then the step it uploads, each under
// its own supervisor with the Bootstrap runner, against one fake Buildkite.
func TestStepsShareArtifactsAndMetaData(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: "steps:\n  - label: producer\n    " + producerStep("supervisor"), Repo: repo, Commit: commits["first"], Branch: "main",
	})
	useBootstrap(h, binDir)
	require.Equal(t, 0, h.start("--finish").wait(t, time.Minute), "producer's log:\n%s", fakebuildkite.PlainLog(h.snapshot().Log))
	snap := h.snapshot()
	build, ok := h.s.Build(snap.BuildID)
	require.True(t, ok)
	assert.Equal(t, "blue", build.MetaData["e2e-color"])
	require.Len(t, build.Annotations, 1)
	assert.Equal(t, fakebuildkite.Annotation{Context: "e2e", Style: "success", Body: "annotated by the producer"}, build.Annotations[0])
	artifacts := h.s.Artifacts(h.job.ID)
	require.Len(t, artifacts, 1)
	assert.Equal(t, "out/greeting.txt", artifacts[0].Path)
	assert.Equal(t, "artifact made by the producer\n", string(artifacts[0].Content))
	require.Len(t, build.Jobs, 2, "the producer uploaded the consumer")

	// The consumer, on another "pod": its own workspace, the same fake.
	consumer := &harness{t: t, s: h.s, dir: t.TempDir(), env: maps.Clone(h.env)}
	consumer.progress, consumer.ws = filepath.Join(consumer.dir, "termination-log"), filepath.Join(consumer.dir, "workspace")
	consumer.job = h.s.AcceptJobForTest(t, "consumer-agent", "queue=supervisor")
	useBootstrap(consumer, binDir)
	require.Equal(t, 0, consumer.start("--finish").wait(t, 2*time.Minute))
	log := fakebuildkite.PlainLog(consumer.snapshot().Log)
	t.Logf("consumer's log:\n%s", log)
	assert.Contains(t, log, "\nartifact made by the producer")
	assert.Contains(t, log, "\ncolor=blue")
}

// TestPluginFromALocalRepository runs a step with a plugin that bootstrap clones from a
// git repository on disk: its environment hook runs, with the step's plugin configuration,
// and its command hook runs in place of the step's command.
func TestPluginFromALocalRepository(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	plugin := greeterPlugin(t, t.TempDir())
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(`echo "the step's own command"`, "plugins:", "  - "+plugin+"#main: {name: e2e}"),
		Repo:         repo, Commit: commits["first"], Branch: "main",
	})
	useBootstrap(h, binDir)
	log := runToPass(t, h)
	assert.Contains(t, log, "\ngreeter environment hook: hello e2e")
	assert.Contains(t, log, "\ngreeter command hook: GREETING=hello e2e")
	assert.NotContains(t, log, "\nthe step's own command")
}

// greeterPlugin makes a plugin repository, greeter-buildkite-plugin (branch main), in dir
// and returns its path: an environment hook that exports a greeting from the plugin's
// configuration, and a command hook that prints it.
func greeterPlugin(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "greeter-buildkite-plugin")
	require.NoError(t, gitrepo.GreeterPlugin(p))
	return p
}

// TestBootstrapCancel cancels a job under the Bootstrap runner, the default: the command
// gets SIGTERM through bootstrap, and its trap runs.
func TestBootstrapCancel(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(`trap 'echo trapped TERM; exit 3' TERM; echo ready; sleep 60 & wait`),
		Repo:         repo, Commit: commits["first"], Branch: "main",
	})
	useBootstrap(h, binDir)
	h.env[podcontract.EnvSignalGrace] = "5"
	sv := h.start("--finish")
	h.waitLog("ready", 30*time.Second)
	require.NoError(t, h.s.CancelJob(h.job.ID))
	code := sv.wait(t, 30*time.Second)
	snap := h.snapshot()
	log := fakebuildkite.PlainLog(snap.Log)
	t.Logf("code %d, exit status %q, signal %q, reason %q; log:\n%s", code, snap.ExitStatus, snap.Signal, snap.SignalReason, log)
	assert.Contains(t, log, "trapped TERM")
	assert.Equal(t, "cancel", snap.SignalReason)
	assert.Equal(t, 1, snap.FinishCount)
}

// useBootstrap sets the harness up as a pod of the default runner: bootstrap from the
// operator's buildkite-agent in binDir, in an image without bash (busybox, as the e2e
// suite's job image).
func useBootstrap(h *harness, binDir string) {
	h.env[podcontract.EnvRunner] = string(bkv1.RunnerBootstrap)
	h.env["BUILDKITE_BIN_PATH"] = binDir
	h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
	h.env[testDefaultShellEnv] = "/no/such/bash"
}

// runToPass runs the harness's job to its end, requires it to pass, and returns its log.
func runToPass(t *testing.T, h *harness) string {
	t.Helper()
	code := h.start("--finish").wait(t, time.Minute)
	log := fakebuildkite.PlainLog(h.snapshot().Log)
	require.Equal(t, 0, code, "the job's log:\n%s", log)
	return log
}

// TestAgentValues checks what the supervisor makes of the job's own values, as
// `buildkite-agent start` v3.138.1 does before it runs bootstrap; TestEnvParity holds the
// whole to the real agent.
func TestAgentValues(t *testing.T) {
	long := strings.Repeat("x", podcontract.MessageMax+1)
	// The agent keeps 64 KiB less "BUILDKITE_MESSAGE=" and the string's end, its note last.
	cut := long[:podcontract.MessageMax-len("BUILDKITE_MESSAGE")-2-len("[value truncated 65537 -> 65517 bytes]")] + "[value truncated 65537 -> 65517 bytes]"
	names := podcontract.EnvJobEnvNames + "=BUILDKITE_PLUGIN_VALIDATION,CI"
	replaced := podcontract.EnvReplacedPrefix + "BUILDKITE_PLUGIN_VALIDATION="
	tests := []struct {
		name string
		env  []string
		want map[string]string // the last value of each
	}{
		{name: "validation on, as the agent reads it", env: []string{"BUILDKITE_PLUGIN_VALIDATION=on"}, want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"}},
		{name: "validation 1", env: []string{"BUILDKITE_PLUGIN_VALIDATION=1"}, want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"}},
		{name: "validation yes is not one of the agent's", env: []string{"BUILDKITE_PLUGIN_VALIDATION=yes"}, want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "false"}},
		{name: "validation as the pod builder set it", env: []string{"BUILDKITE_PLUGIN_VALIDATION=false"}, want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "false"}},
		{name: "no validation setting stays unset", env: []string{"CI=true"}, want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "", "CI": "true"}},
		{name: "a message of 64 KiB stays whole", env: []string{"BUILDKITE_MESSAGE=" + long[:podcontract.MessageMax]}, want: map[string]string{"BUILDKITE_MESSAGE": long[:podcontract.MessageMax]}},
		{name: "a longer message is cut as the agent cuts it", env: []string{"BUILDKITE_MESSAGE=" + long}, want: map[string]string{"BUILDKITE_MESSAGE": cut}},
		// With the names of the job's own env, the supervisor tells the job's value from the
		// configuration's, and ignores, as v3.138 does, a job's value that does not turn
		// validation on.
		{name: "the step turns validation on", env: []string{names, "BUILDKITE_PLUGIN_VALIDATION=on"},
			want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true", "BUILDKITE_IGNORED_ENV": ""}},
		{name: "the step's value that does not turn it on is ignored", env: []string{names, "BUILDKITE_PLUGIN_VALIDATION=yes"},
			want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "false", "BUILDKITE_IGNORED_ENV": "BUILDKITE_PLUGIN_VALIDATION"}},
		{name: "the environment validates, and the step's false is ignored", env: []string{names, "BUILDKITE_PLUGIN_VALIDATION=true", replaced + "false"},
			want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true", "BUILDKITE_IGNORED_ENV": "BUILDKITE_PLUGIN_VALIDATION"}},
		{name: "the environment validates, and so does the step", env: []string{names, "BUILDKITE_PLUGIN_VALIDATION=true", replaced + "1"},
			want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true", "BUILDKITE_IGNORED_ENV": ""}},
		{name: "ignored where the agent names it", env: []string{names, "BUILDKITE_PLUGIN_VALIDATION=false",
			"BUILDKITE_IGNORED_ENV=BUILDKITE_HOOKS_PATH,BUILDKITE_JOB_LOGS_OTLP"},
			want: map[string]string{"BUILDKITE_IGNORED_ENV": "BUILDKITE_HOOKS_PATH,BUILDKITE_PLUGIN_VALIDATION,BUILDKITE_JOB_LOGS_OTLP"}},
		{name: "the configuration's value alone is never ignored", env: []string{podcontract.EnvJobEnvNames + "=CI", "BUILDKITE_PLUGIN_VALIDATION=false"},
			want: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "false", "BUILDKITE_IGNORED_ENV": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := agentValues(slices.Clone(tt.env))
			for k, v := range tt.want {
				assert.Equal(t, v, lookup(got, k), k)
			}
		})
	}
	assert.Len(t, cut, podcontract.MessageMax-len("BUILDKITE_MESSAGE")-2)
}
