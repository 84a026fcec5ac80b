package plugin_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
)

// TestDockerComposeConfig: Debian's docker-compose (1.29) accepts
// docker-compose.yml, it has the services the README promises, and every image
// is one the project builds (make compose-images), never pulled or built from a
// Dockerfile. tests/compose runs the file on a Docker engine.
func TestDockerComposeConfig(t *testing.T) {
	compose := requireTool(t, "docker-compose")
	cmd := exec.Command(compose, "-f", "docker-compose.yml", "config")
	cmd.Dir = repoRoot
	// Without these the file's defaults are used, as on a laptop.
	cmd.Env = append(os.Environ(), "BUILDKITE_AGENT_TOKEN=", "BUILDKITE_AGENT_ENDPOINT=", "BUILDKITE_AGENT_TAGS=", "FAKE_BUILDKITE_PORT=")
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "docker-compose config rejects docker-compose.yml:\n%s", stderr)

	var cfg struct {
		Services map[string]struct {
			Image       string            `json:"image"`
			PullPolicy  string            `json:"pull_policy"`
			Build       any               `json:"build"`
			Environment map[string]string `json:"environment"`
		} `json:"services"`
	}
	require.NoError(t, yaml.Unmarshal(out, &cfg))
	for _, name := range []string{"tests", "lint", "fake-buildkite", "agent"} {
		svc, ok := cfg.Services[name]
		require.True(t, ok, "docker-compose.yml has no %s service", name)
		assert.Nil(t, svc.Build, "service %s: no Dockerfile build, its base image would come from a registry", name)
		assert.Regexp(t, `^bk-operator/compose-`, svc.Image, "service %s runs an image of make compose-images", name)
		assert.Equal(t, "never", svc.PullPolicy, "service %s: its image is loaded, never pulled", name)
	}
	agent := cfg.Services["agent"]
	assert.Equal(t, "http://127.0.0.1:8080/v3", agent.Environment["BUILDKITE_AGENT_ENDPOINT"], "the local agent talks to the fake by default")
	assert.NotEmpty(t, agent.Environment[plugin.OperatorJobEnv], "the local agent stands in for the operator")
	// The mount that makes the agent use the working tree as the plugin's checkout:
	// v3.138 looks under <plugins path>/<agent name>/<plugin id>.
	assert.Contains(t, string(out), "/buildkite/plugins/"+agent.Environment["BUILDKITE_AGENT_NAME"]+"/"+pluginDirID(canonicalSource))
}
