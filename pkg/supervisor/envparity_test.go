package supervisor

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path"
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
	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// dumpEnv is the step that prints what the parity test compares: every variable, one a
// line (backslashes, newlines and carriage returns escaped, so that a value stays on its
// line), the env file the agent writes for the job, sorted, and its JSON twin (one line).
const dumpEnv = `awk 'BEGIN { for (k in ENVIRON) { v = ENVIRON[k]; gsub(/\\/, "\\\\", v); gsub(/\n/, "\\n", v); gsub(/\r/, "\\r", v); print "env: " k "=" v } }' | sort; sort "$BUILDKITE_ENV_FILE" | sed 's/^/envfile: /'; sed 's/^/envjson: /' "$BUILDKITE_ENV_JSON_FILE"`

// TestEnvParity runs the same job, dumpEnv, from the same fake Buildkite, through the real
// `buildkite-agent start` v3.138.1 and through the operator: the job container's env as the
// pod builder makes it (from the job as the spawner maps it), then the supervisor, as in the
// pod. Every variable the job sees must be there on both, with the same value (but those of
// the machine and the test, hostVars, and the operator's own settings, BK_OPERATOR_*),
// except those that the table in docs/pipelines.md ("What differs from an agent") lists: the
// docs are the one list of the differences, and the test holds them to it both ways (a
// difference missing from the docs fails, and so does a row of the docs that no longer
// differs). The env file must be the same, variable by variable, and so must its JSON twin.
//
// The two runs have their own fake, so the values Buildkite makes up per build (its ids, the
// fake's address) are compared as placeholders: <job-id>, <fake> and so on.
func TestEnvParity(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	docRows := envDifferenceRows(t)

	tests := []struct {
		name string
		req  fakebuildkite.BuildRequest
	}{
		{
			name: "a plain step",
			req:  fakebuildkite.BuildRequest{PipelineYAML: pipeline(dumpEnv), Repo: repo, Commit: commits["first"], Branch: "main"},
		},
		{
			name: "a step with its own env, in a group, with a key, a timeout and a long message",
			req: fakebuildkite.BuildRequest{
				PipelineYAML: "steps:\n  - group: checks\n    key: checks\n    steps:\n" +
					"      - command: " + fmt.Sprintf("%q", dumpEnv) + "\n" +
					"        key: env\n        label: \":mag: the env\"\n        agents: {queue: supervisor}\n        timeout_in_minutes: 10\n" +
					"        env:\n" +
					"          FROM_THE_STEP: \"two\\nlines\"\n" +
					"          DEPLOY_TOKEN: s3cret-value\n" +
					// Only the agent's configuration sets these: the agent ignores the step's value.
					"          BUILDKITE_GIT_CLONE_FLAGS: --depth=1\n" +
					// The agent turns validation on for "true", "1" or "on".
					"          BUILDKITE_PLUGIN_VALIDATION: \"on\"\n",
				Repo: repo, Commit: commits["first"], Branch: "main",
				Message: "A subject line\n\nand a body longer than the agent passes on: " + strings.Repeat("0123456789", 7000),
				Env:     map[string]string{"FROM_THE_BUILD": "build value"},
			},
		},
	}
	// Which rows of the docs a difference was seen for; a row never used is out of date.
	used := map[envDifferenceRow]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agent := runOnRealAgent(t, filepath.Join(binDir, "buildkite-agent"), tt.req)
			require.Contains(t, agent.vars, "BUILDKITE_BUILD_PATH", "the real agent's job printed no env:\n%s", agent.log)
			for _, runner := range []bkv1.RunnerMode{bkv1.RunnerBootstrap, bkv1.RunnerCommand} {
				t.Run(string(runner), func(t *testing.T) {
					op := runOnOperator(t, runner, binDir, tt.req)
					for _, name := range slices.Sorted(maps.Keys(union(agent.vars, op.vars))) {
						av, onAgent := agent.vars[name]
						ov, onOperator := op.vars[name]
						row, documented := docRows[envDifferenceKey{name, runner}]
						if !documented {
							row, documented = docRows[envDifferenceKey{name, ""}]
						}
						if !documented {
							if onAgent != onOperator {
								t.Errorf("%s: only one of them gives its job this variable:\n  agent:    %s\n  operator: %s", name, shown(av, onAgent), shown(ov, onOperator))
							} else if av != ov {
								t.Errorf("%s: the operator's job sees another value than the agent's:\n  agent:    %s\n  operator: %s", name, abbreviate(av), abbreviate(ov))
							}
							continue
						}
						if onAgent != onOperator || av != ov {
							used[row] = true
						}
						assert.Equal(t, row.onAgent, onAgent, "docs/pipelines.md says %s is %s on an agent", name, setOrNot(row.onAgent))
						if assert.Equal(t, row.onOperator, onOperator, "docs/pipelines.md says %s is %s under the operator", name, setOrNot(row.onOperator)) && onOperator {
							assert.Regexp(t, row.operatorValue, ov, "%s: the value under the operator is not what docs/pipelines.md says", name)
						}
					}
					require.NotEmpty(t, agent.envJSON, "the real agent's job printed no JSON env file:\n%s", agent.log)
					assert.Equal(t, agent.envJSON, op.envJSON, "the JSON env file (BUILDKITE_ENV_JSON_FILE)")
					require.NotEmpty(t, agent.envFile, "the real agent's job printed no env file:\n%s", agent.log)
					for _, name := range slices.Sorted(maps.Keys(union(agent.envFile, op.envFile))) {
						av, onAgent := agent.envFile[name]
						ov, onOperator := op.envFile[name]
						if onAgent != onOperator || av != ov {
							t.Errorf("%s in the env file (BUILDKITE_ENV_FILE), as the job's env from Buildkite:\n  agent:    %s\n  operator: %s", name, shown(av, onAgent), shown(ov, onOperator))
						}
					}
				})
			}
		})
	}
	if t.Failed() {
		return
	}
	for _, row := range docRows {
		assert.True(t, used[row], "docs/pipelines.md lists %s (%s) as a difference, but the agent and the operator give the same", row.name, row.runnerText)
	}
}

// jobEnv is what the job of a parity run printed: its BUILDKITE_* variables and its env
// file, with the values made per build replaced by placeholders.
type jobEnv struct {
	vars, envFile map[string]string
	envJSON       string
	log           string
}

// runOnRealAgent runs the one job of req on `buildkite-agent start`, with the agent's
// defaults except its folders, and returns what the job printed.
func runOnRealAgent(t *testing.T, agent string, req fakebuildkite.BuildRequest) jobEnv {
	t.Helper()
	s := fakebuildkite.StartForTest(t, fakebuildkite.Options{})
	b, err := s.CreateBuild(req)
	require.NoError(t, err)
	require.Len(t, b.Jobs, 1)
	root := t.TempDir()
	for _, d := range []string{"builds", "hooks", "plugins", "home"} {
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
		"--plugins-path", filepath.Join(root, "plugins"), "--sockets-path", socketsDir(t),
		"--disconnect-after-job")
	// Nothing of the test's own environment that the agent would read as its settings.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(root, "home"), "GIT_CONFIG_GLOBAL=/dev/null"}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "buildkite-agent start:\n%s", out)
	j, ok := s.Job(b.Jobs[0])
	require.True(t, ok)
	log := fakebuildkite.PlainLog(j.Log)
	require.Equal(t, "0", j.ExitStatus, "the job on the real agent; its log:\n%s", log)
	return parseJobEnv(log, perBuild(t, s, j.Env))
}

// runOnOperator runs the one job of req as the operator does: the spawner's BuildJob, the
// pod builder's env for the job container (its paths moved to the test's folders, its
// secrets read as the kubelet would), then the supervisor.
func runOnOperator(t *testing.T, runner bkv1.RunnerMode, binDir string, req fakebuildkite.BuildRequest) jobEnv {
	t.Helper()
	h := newHarness(t, fakebuildkite.Options{}, req)
	placeholders := perBuild(t, h.s, h.job.Env)

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
		// As the spawner makes it: with its intake annotation, the pod gets the token.
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ci", UID: "00000000-0000-4000-8000-000000000001",
			Annotations: map[string]string{bkv1.AnnotationIntake: "nonce"}},
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

	// The pod's folders are the test's: the job sees the test's paths, which are put back
	// as the pod's before the values are compared.
	hooks := filepath.Join(h.dir, "hooks")
	podSockets := path.Join(podcontract.WorkspaceDir, podcontract.SocketsSubdir)
	sockets := socketsDir(t) // see socketsDir: the workspace's is too long for the Job API's socket
	toTest := strings.NewReplacer(podSockets, sockets, podcontract.WorkspaceDir, h.ws, podcontract.BinDir, binDir, podcontract.HooksDir, hooks)
	toPod := strings.NewReplacer(sockets, podSockets, h.ws, podcontract.WorkspaceDir, binDir, podcontract.BinDir, hooks, podcontract.HooksDir)
	vars, podVars := map[string]string{}, map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		// A literal value as the kubelet expands it; one from a Secret as it is.
		v := podcontract.Expand(e.Value, podVars)
		if ref := e.ValueFrom; ref != nil {
			require.NotNil(t, ref.SecretKeyRef, "env %s", e.Name)
			if ref.SecretKeyRef.Key == job.Spec.TokenSecretRef.Key {
				v = h.job.Token
			} else {
				v = secret[strings.TrimPrefix(ref.SecretKeyRef.Key, envSecretKeyPrefix(t))]
			}
		}
		podVars[e.Name] = v
		vars[e.Name] = toTest.Replace(v)
	}
	// The pod's polls are for a cluster; the test's are quicker.
	for _, k := range []string{podcontract.EnvChunkInterval, podcontract.EnvJobStatusInterval} {
		vars[k] = h.env[k]
	}
	h.env = vars
	h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
	h.job.Env = nil // the job's env reaches the supervisor as the pod gives it, above
	log := runToPass(t, h)
	return parseJobEnv(log, func(v string) string { return placeholders(toPod.Replace(v)) })
}

// perBuild replaces, in a value, what the fake s made up for one build, as seen in its job's
// env: the ids, its address, and the random end of the env file's name (os.CreateTemp's, on
// the agent and in the pod alike).
func perBuild(t *testing.T, s *fakebuildkite.Server, env map[string]string) func(string) string {
	t.Helper()
	u, err := url.Parse(s.Endpoint())
	require.NoError(t, err)
	var pairs []string
	for _, k := range []string{"BUILDKITE_JOB_ID", "BUILDKITE_BUILD_ID", "BUILDKITE_STEP_ID", "BUILDKITE_AGENT_ID", "BUILDKITE_GROUP_ID"} {
		if v := env[k]; v != "" {
			pairs = append(pairs, v, "<"+strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "BUILDKITE_"), "_", "-"))+">")
		}
	}
	pairs = append(pairs, u.Scheme+"://"+u.Host, "<fake>")
	r := strings.NewReplacer(pairs...)
	envFile := regexp.MustCompile(`(/job-env-(?:json-)?<job-id>)[0-9]+$`)
	// The Job API's socket is named after bootstrap's pid and a random number.
	jobAPISocket := regexp.MustCompile(`/job-api/[0-9]+-[0-9]+\.sock$`)
	return func(v string) string {
		v = envFile.ReplaceAllString(r.Replace(v), "$1<random>")
		return jobAPISocket.ReplaceAllString(v, "/job-api/<pid>-<random>.sock")
	}
}

var (
	envLine     = regexp.MustCompile(`(?m)^env: ([A-Za-z_][A-Za-z0-9_]*)=(.*?)\r*$`)
	envFileLine = regexp.MustCompile(`(?m)^envfile: ([A-Za-z_][A-Za-z0-9_]*)=(.*?)\r*$`)
	envJSONLine = regexp.MustCompile(`(?m)^envjson: (.*?)\r*$`)
)

// hostVars are the variables of the machine a job runs on, and of the test, that the parity
// test does not compare: a pod is another machine than an agent's host.
//
// _DD_ROOT_GO_SESSION_ID is one of them: buildkite-agent's tracing library (dd-trace-go)
// puts it in the environment of every process it runs, a new id per agent process, so
// bootstrap's jobs have it too (and the Command runner's, which bootstrap does not run,
// do not).
var hostVars = []string{"HOME", "PATH", "PWD", "OLDPWD", "SHLVL", "_", "GIT_CONFIG_GLOBAL", helperEnv, testDefaultShellEnv, "_DD_ROOT_GO_SESSION_ID"}

// operatorSettings begins the names of the operator's settings for its supervisor, which the
// job sees too; docs/pipelines.md says so.
const operatorSettings = "BK_OPERATOR_"

// parseJobEnv reads what dumpEnv printed in log, each value through normalise. The ends of
// the lines are the terminal's (a job's output goes through a pseudo-terminal, on the agent
// and in the pod), not the values'.
func parseJobEnv(log string, normalise func(string) string) jobEnv {
	e := jobEnv{vars: map[string]string{}, envFile: map[string]string{}, log: log}
	for _, m := range envLine.FindAllStringSubmatch(log, -1) {
		if !slices.Contains(hostVars, m[1]) && !strings.HasPrefix(m[1], operatorSettings) {
			e.vars[m[1]] = normalise(m[2])
		}
	}
	for _, m := range envFileLine.FindAllStringSubmatch(log, -1) {
		e.envFile[m[1]] = normalise(m[2])
	}
	if m := envJSONLine.FindStringSubmatch(log); m != nil {
		e.envJSON = normalise(m[1])
	}
	return e
}

// envDifferenceKey is a variable under a runner ("" for both).
type envDifferenceKey struct {
	name   string
	runner bkv1.RunnerMode
}

// envDifferenceRow is a row of the table of differences in docs/pipelines.md.
type envDifferenceRow struct {
	name, runnerText    string
	onAgent, onOperator bool
	operatorValue       string // a regular expression made from the docs' value
}

// envDifferenceTable finds the table's rows: | `NAME` | runner | on an agent | under the operator | why |
var envDifferenceTable = regexp.MustCompile("(?m)^\\| `([A-Z_][A-Z0-9_]*)` \\| ([^|]+) \\| ([^|]+) \\| ([^|]+) \\| ([^|]+) \\|$")

// envDifferenceRows reads the variables whose value differs from an agent's, and why, from
// the table in the section "What differs from an agent" of docs/pipelines.md: pipeline
// authors read it there, and it is the one list of them. A value in the column "Under the
// operator" is `code`, <placeholders> standing for any text; "not set" says the job does not
// have the variable.
func envDifferenceRows(t *testing.T) map[envDifferenceKey]envDifferenceRow {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "pipelines.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(doc), "## What differs from an agent")
	require.True(t, ok, "docs/pipelines.md has no section \"What differs from an agent\"")
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[envDifferenceKey]envDifferenceRow{}
	placeholder := regexp.MustCompile(`<[^>]+>`)
	for _, m := range envDifferenceTable.FindAllStringSubmatch(section, -1) {
		row := envDifferenceRow{name: m[1], runnerText: strings.TrimSpace(m[2])}
		var runners []bkv1.RunnerMode
		switch row.runnerText {
		case "both":
			runners = []bkv1.RunnerMode{""}
		case string(bkv1.RunnerBootstrap), string(bkv1.RunnerCommand):
			runners = []bkv1.RunnerMode{bkv1.RunnerMode(row.runnerText)}
		default:
			t.Fatalf("docs/pipelines.md, %s: the runner is %q; say both, %s or %s", row.name, row.runnerText, bkv1.RunnerBootstrap, bkv1.RunnerCommand)
		}
		row.onAgent = strings.TrimSpace(m[3]) != "not set"
		op := strings.TrimSpace(m[4])
		row.onOperator = op != "not set"
		if row.onOperator {
			code := regexp.MustCompile("^`([^`]*)`").FindStringSubmatch(op)
			require.NotNil(t, code, "docs/pipelines.md, %s: the value under the operator is %q; write it as `code` (then any words), or \"not set\"", row.name, op)
			quoted := placeholder.Split(code[1], -1)
			for i := range quoted {
				quoted[i] = regexp.QuoteMeta(quoted[i])
			}
			row.operatorValue = "^" + strings.Join(quoted, ".+") + "$"
		}
		for _, r := range runners {
			k := envDifferenceKey{row.name, r}
			_, dup := rows[k]
			require.False(t, dup, "docs/pipelines.md lists %s twice", row.name)
			rows[k] = row
		}
	}
	require.NotEmpty(t, rows, "docs/pipelines.md, \"What differs from an agent\", has no table of the variables that differ")
	require.Contains(t, section, "`"+operatorSettings+"*`", "docs/pipelines.md, \"What differs from an agent\", does not say that the job sees the operator's settings")
	return rows
}

// abbreviate shows a value in a failure message: whole when short.
func abbreviate(v string) string {
	const max = 200
	if len(v) <= max {
		return fmt.Sprintf("%q", v)
	}
	return fmt.Sprintf("%q... (%d bytes)", v[:max], len(v))
}

func shown(v string, set bool) string {
	if !set {
		return "not set"
	}
	return abbreviate(v)
}

func setOrNot(set bool) string {
	if set {
		return "set"
	}
	return "not set"
}

func union(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

// envSecretKeyPrefix is what bkv1.EnvSecretKey puts before a variable's name.
func envSecretKeyPrefix(t *testing.T) string {
	k := bkv1.EnvSecretKey("X")
	require.True(t, strings.HasSuffix(k, "X"))
	return strings.TrimSuffix(k, "X")
}
