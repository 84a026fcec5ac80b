package compose

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// composeFile is the file under test, at the repository's root.
var composeFile = filepath.Join(testkit.RepoRoot(), "docker-compose.yml")

// pluginCheckout is the folder name buildkite-agent gives the plugin's checkout
// (github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0).
const pluginCheckout = "github-com-buildkite-plugins-buildkite-operator-buildkite-plugin-v0-1-0"

type service struct {
	Image       string            `json:"image"`
	PullPolicy  string            `json:"pull_policy"`
	NetworkMode string            `json:"network_mode"`
	Build       any               `json:"build"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Volumes     []string          `json:"volumes"`
}

// composeEnv is the environment compose runs with here: the file's defaults unless extra
// says otherwise, whatever the caller's environment (a CI agent's BUILDKITE_AGENT_TOKEN, say)
// holds.
func composeEnv(base []string, extra ...string) []string {
	env := append([]string{}, base...)
	for _, k := range []string{"BUILDKITE_AGENT_TOKEN", "BUILDKITE_AGENT_ENDPOINT", "BUILDKITE_AGENT_TAGS", "FAKE_BUILDKITE_PORT"} {
		env = append(env, k+"=")
	}
	return append(env, extra...)
}

// configOf is the file as `docker-compose config` resolves it: Debian's docker-compose 1.29
// validates it without a Docker engine.
func configOf(t *testing.T, env []string) map[string]service {
	t.Helper()
	compose, err := exec.LookPath("docker-compose")
	require.NoError(t, err, "docker-compose is not installed: run `make test-deps` (or apt-get install -y docker-compose)")
	cmd := exec.Command(compose, "-f", composeFile, "config")
	cmd.Env = env
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "docker-compose config rejects %s:\n%s", composeFile, stderr)
	var cfg struct {
		Services map[string]service `json:"services"`
	}
	require.NoError(t, yaml.Unmarshal(out, &cfg))
	return cfg.Services
}

// TestComposeFileUsesTheProjectsImages: the file is valid, and every service runs an image
// this package builds, never pulled (no registry) and never built from a Dockerfile.
func TestComposeFileUsesTheProjectsImages(t *testing.T) {
	services := configOf(t, composeEnv(os.Environ()))
	cases := []struct {
		service, image, network string
	}{
		{"tests", PluginImage, "none"},
		{"lint", PluginImage, "none"},
		{"fake-buildkite", AgentImage, "host"},
		{"agent", AgentImage, "host"},
	}
	for _, tc := range cases {
		t.Run(tc.service, func(t *testing.T) {
			svc, ok := services[tc.service]
			require.True(t, ok, "docker-compose.yml has no %s service", tc.service)
			assert.Equal(t, tc.image, svc.Image)
			assert.Equal(t, "never", svc.PullPolicy, "the image is loaded from `make compose-images`, never pulled")
			assert.Nil(t, svc.Build, "no Dockerfile build: the base images would come from a registry")
			assert.Equal(t, tc.network, svc.NetworkMode)
		})
	}
	assert.Len(t, services, len(cases), "a service this test does not know")

	// The agent finds the fake where the fake listens, and the plugin where v3.138 looks.
	fake, agent := services["fake-buildkite"], services["agent"]
	assert.Contains(t, fake.Command, "-listen=127.0.0.1:8080")
	assert.Equal(t, "http://127.0.0.1:8080/v3", agent.Environment["BUILDKITE_AGENT_ENDPOINT"])
	assert.NotEmpty(t, agent.Environment["BUILDKITE_OPERATOR_JOB"], "the local agent stands in for the operator")
	mount := testkit.RepoRoot() + ":" + filepath.Join(agent.Environment["BUILDKITE_PLUGINS_PATH"], agent.Environment["BUILDKITE_AGENT_NAME"], pluginCheckout) + ":ro"
	assert.Contains(t, agent.Volumes, mount)

	raw, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	assert.Contains(t, string(raw), "make compose-images", "the file says how to build its images")
}

// TestComposeFileTakesTheFakesPort: FAKE_BUILDKITE_PORT and BUILDKITE_AGENT_ENDPOINT move
// the fake and the agent together, which TestComposeUp relies on.
func TestComposeFileTakesTheFakesPort(t *testing.T) {
	services := configOf(t, composeEnv(os.Environ(), "FAKE_BUILDKITE_PORT=18080", "BUILDKITE_AGENT_ENDPOINT=http://127.0.0.1:18080/v3"))
	assert.Contains(t, services["fake-buildkite"].Command, "-listen=127.0.0.1:18080")
	assert.Equal(t, "http://127.0.0.1:18080/v3", services["agent"].Environment["BUILDKITE_AGENT_ENDPOINT"])
}

var (
	buildOnce  sync.Once
	builtPaths []string
	buildErr   error
	buildDir   string
)

// builtImages builds the images once for the package's tests, into a folder removed at exit.
func builtImages(t *testing.T) []string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "compose-images-")
		if buildErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			builtPaths, buildErr = BuildImages(ctx, buildDir, "")
		}
	})
	require.NoError(t, buildErr)
	return builtPaths
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// TestImagesHoldWhatTheServicesRun: each image has the programs its services' commands name.
func TestImagesHoldWhatTheServicesRun(t *testing.T) {
	paths := builtImages(t)
	require.Len(t, paths, 2)
	cases := []struct {
		image string
		want  []string
	}{
		{PluginImage, []string{"bin/bash", "bin/sh", "usr/bin/bats", "usr/libexec/bats-core/bats-exec-test", "usr/lib/bats/bats-assert/load.bash", "usr/lib/bats/bats-support/load.bash", "usr/bin/shellcheck", strings.TrimPrefix(PluginTestPath, "/"), "usr/bin/env", "tmp"}},
		{AgentImage, []string{"bin/bash", "bin/sh", "usr/bin/git", "usr/lib/git-core/git-upload-pack", "usr/bin/ssh", "etc/gitconfig", "etc/ssl/certs/ca-certificates.crt", strings.TrimPrefix(AgentPath, "/"), strings.TrimPrefix(FakeBuildkitePath, "/")}},
	}
	for _, tc := range cases {
		t.Run(tc.image, func(t *testing.T) {
			path := filepath.Join(filepath.Dir(paths[0]), images.TarName(tc.image))
			have := entriesOf(t, path, tc.image)
			for _, w := range tc.want {
				assert.Contains(t, have, w)
			}
			// Programs from Debian bring their libraries (bash needs libtinfo).
			assert.True(t, slices.ContainsFunc(have, func(p string) bool { return strings.HasSuffix(p, "/libtinfo.so.6") }), "bash's libtinfo")
		})
	}
}

// freePort is a TCP port on 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// composeCLI is `docker compose` where the Compose plugin is installed, else Debian's
// docker-compose.
func composeCLI(t *testing.T, env []string) []string {
	t.Helper()
	cmd := exec.Command("docker", "compose", "version")
	cmd.Env = env
	if err := cmd.Run(); err == nil {
		return []string{"docker", "compose"}
	}
	p, err := exec.LookPath("docker-compose")
	require.NoError(t, err, "neither `docker compose` nor docker-compose is installed: apt-get install docker-compose")
	return []string{p}
}

// TestComposeUp runs `docker compose up` on a Docker engine of its own: the plugin's bats
// tests and lint pass, and the local buildkite-agent runs the example pipeline's jobs from
// the fake Buildkite, the plugin's hook passing the first and failing the second.
func TestComposeUp(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Docker engine and runs docker-compose.yml; not in -short")
	}
	// Its own folder per run, under .cache as the Makefile keeps its state, and short enough
	// for the engine's unix sockets.
	parent := filepath.Join(testkit.RepoRoot(), ".cache", "docker")
	require.NoError(t, CleanStale(parent, "test-"), "cleaning up after an earlier run that was killed")
	dir := filepath.Join(parent, "test-"+strconv.Itoa(os.Getpid()))
	if len(dir) > 60 {
		var err error
		dir, err = os.MkdirTemp("", "bkd-")
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	engine, err := StartEngine(ctx, dir)
	if err != nil {
		t.Skipf("no Docker engine: %v", err)
	}
	t.Cleanup(func() {
		assert.NoError(t, engine.Stop(), "stopping the Docker engine")
		assert.Empty(t, processesUnder(engine.Dir), "processes of the engine outlived it")
		assert.NoDirExists(t, engine.Dir)
	})
	t.Logf("Docker engine up in %s", engine.Dir)

	require.NoError(t, Load(ctx, engine.Env(), builtImages(t)...))

	port := freePort(t)
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	env := composeEnv(engine.Env(),
		"FAKE_BUILDKITE_PORT="+strconv.Itoa(port),
		"BUILDKITE_AGENT_ENDPOINT="+endpoint+"/v3",
		"COMPOSE_PROJECT_NAME=bkopcompose"+strconv.Itoa(os.Getpid()))
	cli := composeCLI(t, env)
	compose := func(ctx context.Context, args ...string) (string, error) {
		full := append(append([]string{}, cli[1:]...), append([]string{"-f", composeFile}, args...)...)
		cmd := exec.CommandContext(ctx, cli[0], full...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		// The containers go before the engine; what they printed goes to the test log.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			out, _ := compose(ctx, "logs", "--no-color")
			t.Logf("docker-compose logs:\n%s", out)
		}
		out, err := compose(ctx, "down", "--timeout", "10")
		assert.NoError(t, err, "%s down:\n%s", strings.Join(cli, " "), out)
	})

	start := time.Now()
	out, err := compose(ctx, "up", "--detach")
	require.NoError(t, err, "%s up:\n%s", strings.Join(cli, " "), out)

	// The bats tests and the lint end by themselves; their exit status is the verdict.
	for _, svc := range []string{"tests", "lint"} {
		id, err := compose(ctx, "ps", "-q", svc)
		require.NoError(t, err, id)
		status := docker(ctx, t, engine, "wait", strings.TrimSpace(id))
		logs, _ := compose(ctx, "logs", "--no-color", svc)
		require.Equal(t, "0", status, "%s failed:\n%s", svc, logs)
		switch svc {
		case "tests":
			assert.Regexp(t, regexp.MustCompile(`ok \d+ `), logs, "bats ran tests")
			assert.NotContains(t, logs, "not ok")
		case "lint":
			assert.Contains(t, logs, "PASS")
		}
	}

	// The agent takes both jobs of plugin/examples/pipeline.yml from the fake.
	jobs := finishedJobs(ctx, t, endpoint, 2)
	t.Logf("compose up to both jobs finished: %s", time.Since(start).Round(time.Second))
	var agents []fakebuildkite.AgentSnapshot
	require.NoError(t, getJSON(ctx, endpoint+"/control/agents", &agents))
	agentIDs := map[string]string{} // name -> id
	for _, a := range agents {
		agentIDs[a.Name] = a.ID
		if a.Name == "local" {
			assert.Contains(t, a.Version, strings.TrimPrefix(testkit.AgentVersion, "v"), "the compose agent is the project's buildkite-agent")
		}
	}
	require.Contains(t, agentIDs, "local", "the compose agent registered with the fake")
	byLabel := map[string]fakebuildkite.JobView{}
	for _, j := range jobs {
		byLabel[j.Label] = j
	}
	cases := []struct {
		label, exit, log string
	}{
		{":white_check_mark: valid options", "0", "the operator would run this in BuildEnvironment go-1-26"},
		{":x: an ordinary agent picked this up", "1", "not under buildkite-operator"},
	}
	for _, tc := range cases {
		j, ok := byLabel[tc.label]
		if !assert.True(t, ok, "no job %q among %v", tc.label, jobs) {
			continue
		}
		assert.Equal(t, agentIDs["local"], j.AcceptedBy, "the compose agent ran %q", tc.label)
		assert.Equal(t, tc.exit, j.ExitStatus, "%s:\n%s", tc.label, j.PlainLog)
		assert.Contains(t, j.PlainLog, tc.log, tc.label)
	}
}

// docker runs the docker CLI against the engine and returns its trimmed output.
func docker(ctx context.Context, t *testing.T, e *Engine, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = e.Env()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docker %v:\n%s", args, out)
	return strings.TrimSpace(string(out))
}

// finishedJobs polls the fake's control API until n jobs have finished.
func finishedJobs(ctx context.Context, t *testing.T, endpoint string, n int) []fakebuildkite.JobView {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last []fakebuildkite.JobView
	for {
		var jobs []fakebuildkite.JobView
		if err := getJSON(ctx, endpoint+"/control/jobs", &jobs); err == nil {
			last = jobs
			done := 0
			for _, j := range jobs {
				if j.State == fakebuildkite.StateFinished {
					done++
				}
			}
			if done >= n {
				return jobs
			}
		}
		select {
		case <-ctx.Done():
			require.FailNow(t, "the agent did not finish the jobs", "after 3 minutes; the fake has: %+v", last)
		case <-time.After(time.Second):
		}
	}
}

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// entriesOf lists the paths in an image tarball's filesystem (directories without their
// trailing slash).
func entriesOf(t *testing.T, path, ref string) []string {
	t.Helper()
	tag, err := name.NewTag(ref)
	require.NoError(t, err)
	img, err := tarball.ImageFromPath(path, &tag)
	require.NoError(t, err)
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		require.NoError(t, err)
		names = append(names, strings.TrimSuffix(h.Name, "/"))
	}
}
