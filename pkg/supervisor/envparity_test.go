package supervisor

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/plugin"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// envDifferences are the BUILDKITE_* names that a job sees on `buildkite-agent start` but
// not under the operator (onlyAgent), and the other way round (onlyOperator), for each
// runner. docs/pipelines.md, "What differs from an agent", says why for every one of them.
var envDifferences = map[bkv1.RunnerMode]struct{ onlyAgent, onlyOperator []string }{
	bkv1.RunnerBootstrap: {
		onlyOperator: []string{podcontract.EnvPodMarker},
	},
	bkv1.RunnerCommand: {
		onlyOperator: []string{podcontract.EnvPodMarker},
	},
}

// TestEnvParity runs the same job, `env | sort`, from the same fake Buildkite, through the
// real `buildkite-agent start` v3.52.0 and through the operator: the job container's env as
// the pod builder makes it (from the job as the spawner maps it), then the supervisor, as in
// the pod. The BUILDKITE_* names the job sees must be the same, except envDifferences.
func TestEnvParity(t *testing.T) {
	binDir := agentBinary(t)
	repo, commits := gitRepo(t)
	req := fakebuildkite.BuildRequest{PipelineYAML: pipeline("env | sort"), Repo: repo, Commit: commits["first"], Branch: "main"}

	agentLog := runOnRealAgent(t, filepath.Join(binDir, "buildkite-agent"), req)
	agentNames := buildkiteNames(agentLog)
	require.Contains(t, agentNames, "BUILDKITE_BUILD_PATH", "the real agent's job printed no env:\n%s", agentLog)

	for _, runner := range []bkv1.RunnerMode{bkv1.RunnerBootstrap, bkv1.RunnerCommand} {
		t.Run(string(runner), func(t *testing.T) {
			log := runOnOperator(t, runner, binDir, req)
			names := buildkiteNames(log)
			want := envDifferences[runner]
			assert.Equal(t, sorted(want.onlyAgent), difference(agentNames, names),
				"names the agent gives its job and the operator does not; operator's job log:\n%s", log)
			assert.Equal(t, sorted(want.onlyOperator), difference(names, agentNames),
				"names the operator gives its job and the agent does not; agent's job log:\n%s", agentLog)
		})
	}

	// Every difference is explained where pipeline authors read.
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "pipelines.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "## What differs from an agent")
	require.True(t, ok, "docs/pipelines.md has no section \"What differs from an agent\"")
	section, _, _ = strings.Cut(section, "\n## ")
	for runner, d := range envDifferences {
		for _, name := range append(slices.Clone(d.onlyAgent), d.onlyOperator...) {
			assert.Contains(t, section, "`"+name+"`", "docs/pipelines.md does not explain why %s differs under the %s runner", name, runner)
		}
	}
}

// runOnRealAgent runs the one job of req on `buildkite-agent start`, with the agent's
// defaults except its folders, and returns the job's log.
func runOnRealAgent(t *testing.T, agent string, req fakebuildkite.BuildRequest) string {
	t.Helper()
	s := fakebuildkite.StartForTest(t, fakebuildkite.Options{})
	b, err := s.CreateBuild(req)
	require.NoError(t, err)
	require.Len(t, b.Jobs, 1)
	root := t.TempDir()
	for _, d := range []string{"builds", "hooks", "plugins", "sockets", "home"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The name and tags the harness accepts its jobs with, so that the fake gives both jobs
	// the same agent name and meta-data.
	cmd := exec.CommandContext(ctx, agent, "start",
		"--token", s.RegistrationToken(), "--endpoint", s.Endpoint(),
		"--name", "supervisor-test", "--tags", "queue=supervisor",
		"--build-path", filepath.Join(root, "builds"), "--hooks-path", filepath.Join(root, "hooks"),
		"--plugins-path", filepath.Join(root, "plugins"), "--sockets-path", filepath.Join(root, "sockets"),
		"--disconnect-after-job")
	// Nothing of the test's own environment that the agent would read as its settings.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(root, "home"), "GIT_CONFIG_GLOBAL=/dev/null"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "buildkite-agent start:\n%s", out)
	j, ok := s.Job(b.Jobs[0])
	require.True(t, ok)
	require.Equal(t, "0", j.ExitStatus, "the job on the real agent; its log:\n%s", fakebuildkite.PlainLog(j.Log))
	return fakebuildkite.PlainLog(j.Log)
}

// runOnOperator runs the one job of req as the operator does: the spawner's BuildJob, the
// pod builder's env for the job container (its paths moved to the test's folders, its
// secrets read as the kubelet would), then the supervisor.
func runOnOperator(t *testing.T, runner bkv1.RunnerMode, binDir string, req fakebuildkite.BuildRequest) string {
	t.Helper()
	h := newHarness(t, fakebuildkite.Options{}, req)

	// As the spawner maps an accepted job (pkg/spawner mapping.go and create.go): no
	// tokens in the env, the operator's own plugin stripped (the variable dropped when it
	// was the only one), and every value kept in the token Secret.
	secret := maps.Clone(h.job.Env)
	delete(secret, podcontract.EnvAccessToken)
	delete(secret, "BUILDKITE_AGENT_TOKEN")
	stripped, err := plugin.StripOperatorPlugin(secret["BUILDKITE_PLUGINS"])
	require.NoError(t, err)
	if stripped == "" {
		delete(secret, "BUILDKITE_PLUGINS")
	} else {
		secret["BUILDKITE_PLUGINS"] = stripped
	}
	name := strings.ToLower(h.job.ID)
	job := &bkv1.BuildJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ci", UID: "00000000-0000-4000-8000-000000000001"},
		Spec: bkv1.BuildJobSpec{
			JobID:          name,
			PipelineSlug:   h.job.Env["BUILDKITE_PIPELINE_SLUG"],
			BuildNumber:    1,
			Command:        h.job.Env["BUILDKITE_COMMAND"],
			EnvNames:       slices.Sorted(maps.Keys(secret)),
			TokenSecretRef: bkv1.SecretKeyRef{Name: name + "-token", Key: bkv1.DefaultSecretKey},
		},
	}
	env := &bkv1.BuildEnvironment{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "ci"},
		Spec: bkv1.BuildEnvironmentSpec{Image: "bk-operator/job:dev", Runner: runner}}
	pod, err := podbuilder.Build(job, env, podbuilder.Options{AgentEndpoint: h.s.Endpoint()})
	require.NoError(t, err)

	hooks := filepath.Join(h.dir, "hooks")
	paths := strings.NewReplacer(podcontract.WorkspaceDir, h.ws, podcontract.BinDir, binDir, podcontract.HooksDir, hooks)
	vars := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		v := e.Value
		if ref := e.ValueFrom; ref != nil {
			require.NotNil(t, ref.SecretKeyRef, "env %s", e.Name)
			if ref.SecretKeyRef.Key == job.Spec.TokenSecretRef.Key {
				v = h.job.Token
			} else {
				v = secret[strings.TrimPrefix(ref.SecretKeyRef.Key, envSecretKeyPrefix(t))]
			}
		}
		vars[e.Name] = paths.Replace(v)
	}
	// The pod's polls are for a cluster; the test's are quicker.
	for _, k := range []string{podcontract.EnvChunkInterval, podcontract.EnvJobStatusInterval} {
		vars[k] = h.env[k]
	}
	h.env = vars
	h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
	h.job.Env = nil // the job's env reaches the supervisor as the pod gives it, above
	return runToPass(t, h)
}

// envSecretKeyPrefix is what bkv1.EnvSecretKey puts before a variable's name.
func envSecretKeyPrefix(t *testing.T) string {
	k := bkv1.EnvSecretKey("X")
	require.True(t, strings.HasSuffix(k, "X"))
	return strings.TrimSuffix(k, "X")
}

var envLine = regexp.MustCompile(`(?m)^(BUILDKITE[A-Z0-9_]*)=`)

// buildkiteNames are the names of the BUILDKITE* variables `env | sort` printed in log.
func buildkiteNames(log string) []string {
	var names []string
	for _, m := range envLine.FindAllStringSubmatch(log, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// difference is a sorted list of the names in a that are not in b.
func difference(a, b []string) []string {
	out := []string{}
	for _, n := range a {
		if !slices.Contains(b, n) {
			out = append(out, n)
		}
	}
	return out
}

func sorted(s []string) []string {
	out := append([]string{}, s...)
	slices.Sort(out)
	return out
}
