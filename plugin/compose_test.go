package plugin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestDockerComposeConfig: Debian's docker-compose (1.29) accepts
// docker-compose.yml, it has the services the README promises, and every image
// builds from a Dockerfile in the repository.
func TestDockerComposeConfig(t *testing.T) {
	compose := requireTool(t, "docker-compose")
	cmd := exec.Command(compose, "-f", "docker-compose.yml", "config")
	cmd.Dir = repoRoot
	// Without these the file's defaults are used, as on a laptop.
	cmd.Env = append(os.Environ(), "BUILDKITE_AGENT_TOKEN=", "BUILDKITE_AGENT_ENDPOINT=", "BUILDKITE_AGENT_TAGS=")
	out, err := cmd.Output()
	var stderr []byte
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = ee.Stderr
	}
	require.NoError(t, err, "docker-compose config rejects docker-compose.yml:\n%s", stderr)

	var cfg struct {
		Services map[string]struct {
			Build *struct {
				Context    string `json:"context"`
				Dockerfile string `json:"dockerfile"`
			} `json:"build"`
			Environment map[string]string `json:"environment"`
			Volumes     []any             `json:"volumes"`
		} `json:"services"`
	}
	require.NoError(t, yaml.Unmarshal(out, &cfg))
	for _, name := range []string{"tests", "lint", "fake-buildkite", "agent"} {
		svc, ok := cfg.Services[name]
		require.True(t, ok, "docker-compose.yml has no %s service", name)
		require.NotNil(t, svc.Build, "service %s must build its image from a Dockerfile in the repository", name)
		_, err := os.Stat(filepath.Join(svc.Build.Context, svc.Build.Dockerfile))
		assert.NoError(t, err, "service %s: Dockerfile %s", name, svc.Build.Dockerfile)
	}
	agent := cfg.Services["agent"]
	assert.Equal(t, "http://fake-buildkite:8080/v3", agent.Environment["BUILDKITE_AGENT_ENDPOINT"], "the local agent talks to the fake by default")
	assert.NotEmpty(t, agent.Environment[OperatorJobEnv], "the local agent stands in for the operator")
	// The mount that makes the agent use the working tree as the plugin's checkout.
	assert.Contains(t, string(out), "/buildkite/plugins/"+pluginDirID(canonicalSource))
}
