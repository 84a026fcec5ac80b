package plugin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"

	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
)

// These tests run the real `buildkite-agent bootstrap` (v3.138.1, built by
// `make agent-binary`) on a job that uses this plugin, to prove the agent runs
// hooks/environment as Buildkite will and fails the job with its message.
//
// How v3.138.1 treats a plugin given as a local path (agent/plugin/plugin.go,
// internal/job/executor.go checkoutPlugin and VendoredPluginPhase):
//   - an absolute path (/srv/buildkite-operator#v0.1.0) is NOT used in place: it is
//     git-cloned into BUILDKITE_PLUGINS_PATH/<agent name>/<id> and the #version checked out,
//     so it must be a git repository and only committed files count;
//   - a "./" path is "vendored": used in place, relative to the job's checkout,
//     and its environment hook runs after the checkout;
//   - any source whose BUILDKITE_PLUGINS_PATH/<agent name>/<id> is a repository with a
//     commit counts as already checked out and is used as it is (its hooks must be files
//     within it, not links out of it): that is how the working tree's plugin is tested
//     below (and how docker-compose.yml's agent runs the plugin).

const repoRoot = ".."

// shortTempDir is a folder with a short path, removed when t ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bk-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// fakeJobAPI answers the agent API calls a bootstrap makes for one job
// (meta-data for the checkout, annotations from the hook) and records them.
type fakeJobAPI struct {
	mu       sync.Mutex
	requests []string
	bodies   map[string][]string // path → request bodies
}

func (f *fakeJobAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	f.bodies[r.URL.Path] = append(f.bodies[r.URL.Path], string(body))
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Token job-token-for-test" {
		http.Error(w, `{"message":"bad token"}`, http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch p := r.URL.Path; {
	case strings.HasSuffix(p, "/data/exists"):
		_, _ = io.WriteString(w, `{"exists":false}`)
	case strings.HasSuffix(p, "/data/get"):
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"message":"No key found"}`)
	case strings.HasSuffix(p, "/data/set"):
		_, _ = io.WriteString(w, `{}`)
	case strings.HasSuffix(p, "/annotations"):
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"annotation-1"}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"message":"not served by this test"}`)
	}
}

func (f *fakeJobAPI) annotations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for p, bodies := range f.bodies {
		if strings.HasSuffix(p, "/annotations") {
			out = append(out, bodies...)
		}
	}
	return out
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// copyPlugin copies the plugin's files (plugin.yml, hooks/) from the working tree into dir.
func copyPlugin(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "hooks"), 0o755))
	for _, f := range []string{"plugin.yml", "hooks/environment"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o755))
	}
}

// placePlugin makes dir a checkout of the plugin as the agent leaves one, with the working
// tree's plugin.yml and hooks: the agent finds it checked out (a repository with a commit;
// v3.138 reads it, and refuses hooks that are links out of the plugin's folder) and uses it.
func placePlugin(t *testing.T, dir string) {
	t.Helper()
	copyPlugin(t, dir)
	git(t, dir, "init", "-q")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "the plugin in place")
}

var nonIDRun = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// pluginDirID is the folder name the agent checks a plugin out to (Plugin.Identifier).
func pluginDirID(source string) string {
	return strings.Trim(nonIDRun.ReplaceAllString(source, "-"), "-")
}

// testAgentName is the ordinary agent the tests' bootstrap runs as.
const testAgentName = "laptop-1"

type bootstrapRun struct {
	output    string
	exitErr   error
	api       *fakeJobAPI
	annotated []string
}

type jobSetup struct {
	source      string            // plugin source as BUILDKITE_PLUGINS carries it
	config      map[string]any    // plugin config
	place       string            // "clone", "vendored" or "in-place"
	operatorJob bool              // set the operator's marker variable
	extraEnv    map[string]string // more job env
}

func runBootstrap(t *testing.T, job jobSetup) bootstrapRun {
	t.Helper()
	agent := testkit.RequireAgent(t)
	tmp := t.TempDir()
	api := &fakeJobAPI{bodies: map[string][]string{}}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)

	// The job's repository.
	repo := filepath.Join(tmp, "repo")
	require.NoError(t, os.MkdirAll(repo, 0o755))
	git(t, repo, "init", "-q")
	require.NoError(t, os.WriteFile(filepath.Join(repo, "README"), []byte("a pipeline's repository\n"), 0o644))
	pluginsPath := filepath.Join(tmp, "plugins")
	require.NoError(t, os.MkdirAll(pluginsPath, 0o755))

	switch job.place {
	case "vendored":
		copyPlugin(t, filepath.Join(repo, ".buildkite", "plugins", "buildkite-operator"))
	case "clone":
		src := filepath.Join(tmp, "src", "buildkite-operator")
		copyPlugin(t, src)
		git(t, src, "init", "-q")
		git(t, src, "add", ".")
		git(t, src, "commit", "-q", "-m", "plugin")
		git(t, src, "tag", "v0.1.0")
		job.source = src + "#v0.1.0"
	case "in-place":
		// bootstrap (v3.138) checks plugins out under a folder of the agent's name.
		placePlugin(t, filepath.Join(pluginsPath, testAgentName, pluginDirID(job.source)))
	default:
		t.Fatalf("unknown place %q", job.place)
	}
	git(t, repo, "add", ".")
	git(t, repo, "commit", "-q", "-m", "first")
	commit := git(t, repo, "rev-parse", "HEAD")

	var cfg any
	if job.config != nil {
		cfg = job.config
	}
	plugins, err := json.Marshal([]map[string]any{{job.source: cfg}})
	require.NoError(t, err)

	env := map[string]string{
		"PATH":                            filepath.Dir(agent) + ":" + os.Getenv("PATH"),
		"HOME":                            tmp,
		"BUILDKITE":                       "true",
		"CI":                              "true",
		"BUILDKITE_JOB_ID":                "0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e",
		"BUILDKITE_BUILD_ID":              "0190e6b1-0000-4c1e-9d0a-3a7f1b2c4d5e",
		"BUILDKITE_BUILD_NUMBER":          "1",
		"BUILDKITE_LABEL":                 ":go: test",
		"BUILDKITE_REPO":                  repo,
		"BUILDKITE_COMMIT":                commit,
		"BUILDKITE_BRANCH":                "main",
		"BUILDKITE_AGENT_NAME":            testAgentName,
		"BUILDKITE_ORGANIZATION_SLUG":     "acme",
		"BUILDKITE_PIPELINE_SLUG":         "service",
		"BUILDKITE_PIPELINE_PROVIDER":     "git",
		"BUILDKITE_COMMAND":               "echo hello from the step",
		"BUILDKITE_PLUGINS":               string(plugins),
		"BUILDKITE_BUILD_PATH":            filepath.Join(tmp, "builds"),
		"BUILDKITE_PLUGINS_PATH":          pluginsPath,
		"BUILDKITE_HOOKS_PATH":            filepath.Join(tmp, "hooks"),
		"BUILDKITE_AGENT_ACCESS_TOKEN":    "job-token-for-test",
		"BUILDKITE_AGENT_ENDPOINT":        srv.URL + "/v3",
		"BUILDKITE_AGENT_META_DATA_QUEUE": "default",
		// bootstrap (v3.138) serves the Job API on a unix socket under this folder and
		// refuses a socket path over 108 bytes, which one under t.TempDir() can be.
		"BUILDKITE_SOCKETS_PATH": shortTempDir(t),
	}
	if job.operatorJob {
		env[plugin.OperatorJobEnv] = "buildkite/0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e"
	}
	for k, v := range job.extraEnv {
		env[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, "bootstrap")
	cmd.Dir = tmp
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "bootstrap timed out:\n%s", out)
	return bootstrapRun{output: string(out), exitErr: err, api: api, annotated: api.annotations()}
}

const canonicalSource = "github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0"

func TestBootstrapFailsWithTheHooksMessage(t *testing.T) {
	bad := map[string]any{"build_environment": "go-1-26", "log_paths": []string{"/workspace/a.log", "logs/app.log"}}
	const want = `plugin buildkite-operator: log_paths[1] "logs/app.log" is not an absolute path: give the full path inside the job's container, such as /workspace/logs/app.log`
	for _, tc := range []struct {
		name string
		job  jobSetup
	}{
		{"absolute local path, cloned at its version", jobSetup{config: bad, place: "clone", operatorJob: true}},
		{"vendored path inside the job's repository", jobSetup{source: "./.buildkite/plugins/buildkite-operator", config: bad, place: "vendored", operatorJob: true}},
		{"working tree in place, canonical source", jobSetup{source: canonicalSource, config: bad, place: "in-place", operatorJob: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := runBootstrap(t, tc.job)
			require.Error(t, run.exitErr, "bootstrap must fail:\n%s", run.output)
			var exitErr *exec.ExitError
			require.ErrorAs(t, run.exitErr, &exitErr)
			assert.NotZero(t, exitErr.ExitCode())
			assert.Contains(t, run.output, want)
			assert.NotContains(t, run.output, "hello from the step", "the command must not run")
			require.Len(t, run.annotated, 1, "the hook annotates the build once:\n%s", run.output)
			var ann struct{ Body, Context, Style string }
			require.NoError(t, json.Unmarshal([]byte(run.annotated[0]), &ann))
			assert.Equal(t, "error", ann.Style)
			assert.Equal(t, "buildkite-operator-0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e", ann.Context)
			assert.Contains(t, ann.Body, want)
		})
	}
}

func TestBootstrapOnAnOrdinaryAgentSaysToTargetTheOperator(t *testing.T) {
	run := runBootstrap(t, jobSetup{source: canonicalSource, config: map[string]any{"build_environment": "go-1-26"}, place: "in-place"})
	require.Error(t, run.exitErr, "bootstrap must fail:\n%s", run.output)
	assert.Contains(t, run.output, `this step ran on the ordinary Buildkite agent "laptop-1" (queue "default"), not under buildkite-operator`)
	assert.Contains(t, run.output, "queue: bk-operator")
	assert.NotContains(t, run.output, "hello from the step")
}

func TestBootstrapRunsTheStepWithValidOptions(t *testing.T) {
	good := map[string]any{
		"build_environment":  "go-1-26",
		"log_paths":          []string{"/workspace/service.log"},
		"timeout_in_minutes": 30,
		"resources":          map[string]any{"requests": map[string]any{"cpu": "500m", "memory": 1073741824}, "limits": map[string]any{"memory": "2Gi"}},
	}
	for _, tc := range []struct {
		name  string
		extra map[string]string
	}{
		{name: "plugin validation off (the agent's default)"},
		// With validation on, the agent checks the config against plugin.yml with
		// its own JSON schema library: the schema must compile and pass there too.
		{name: "plugin validation on", extra: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := runBootstrap(t, jobSetup{source: canonicalSource, config: good, place: "in-place", operatorJob: true, extraEnv: tc.extra})
			require.NoError(t, run.exitErr, "bootstrap must pass:\n%s", run.output)
			assert.Contains(t, run.output, "buildkite-operator: options are valid (BuildJob buildkite/0190e6b1-5f2c-4c1e-9d0a-3a7f1b2c4d5e)")
			assert.Contains(t, run.output, "hello from the step")
			assert.Empty(t, run.annotated)
		})
	}
}

func TestBootstrapPluginValidationUsesTheSchema(t *testing.T) {
	run := runBootstrap(t, jobSetup{
		source: canonicalSource, config: map[string]any{"log_path": []string{"/a"}}, place: "in-place", operatorJob: true,
		extraEnv: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"},
	})
	require.Error(t, run.exitErr, "bootstrap must fail:\n%s", run.output)
	assert.Contains(t, run.output, "Plugin validation failed")
	assert.NotContains(t, run.output, "hello from the step")
}
