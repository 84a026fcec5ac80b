package cluster

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// The node's default containerd folder is named after the version the Makefile builds, from
// the module that tests/tools/containerd pins: were they to drift, the node would look for
// binaries that make cluster-binaries never builds, or run another containerd than the one
// pinned.
func TestContainerdVersionsAgree(t *testing.T) {
	root := testkit.RepoRoot()
	read := func(rel string) []byte {
		b, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err)
		return b
	}
	find := func(where string, re *regexp.Regexp, b []byte) string {
		m := re.FindSubmatch(b)
		require.NotNil(t, m, "%s names no containerd version (%s)", where, re)
		return string(m[1])
	}
	versions := map[string]string{
		"Makefile (CONTAINERD_VERSION)": find("the Makefile", regexp.MustCompile(`(?m)^CONTAINERD_VERSION\s*\?=\s*(\S+)\s*$`), read("Makefile")),
		"tests/tools/containerd/go.mod": find("tests/tools/containerd/go.mod",
			regexp.MustCompile(`(?m)^(?:require)?\s*github\.com/containerd/containerd/v2\s+(v\S+)`), read("tests/tools/containerd/go.mod")),
	}
	for where, v := range versions {
		assert.Equal(t, ContainerdVersion, v, "%s and tests/cluster.ContainerdVersion differ: make them the same", where)
	}
	assert.Equal(t, filepath.Join(root, ".cache", "containerd-"+ContainerdVersion), DefaultContainerdDir())
}

// The node's containerd reads its config without a key it does not know (it would ignore
// it, and the setting with it), and with every path where the node wants it. It needs the
// binary from make cluster-binaries: without it the test skips, except under E2E=1.
func TestContainerdConfig(t *testing.T) {
	bin := filepath.Join(DefaultContainerdDir(), "containerd")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("E2E") == "1" {
			t.Fatalf("%s: %v (make cluster-binaries)", bin, err)
		}
		t.Skipf("%s not built (make cluster-binaries)", bin)
	}
	c, err := newCluster(Options{StateDir: t.TempDir()})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "containerd.toml")
	require.NoError(t, os.WriteFile(path, []byte(c.containerdConfig()), 0o644))

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "--config", path, "config", "dump")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "containerd config dump: %s", stderr.String())
	assert.NotContains(t, stderr.String(), "unknown key", "containerd ignores part of the config")
	assert.NotContains(t, stderr.String(), "level=error")

	run := c.runDir
	// The dump's lines (TOML, values in single quotes), each in the plugin that must have it.
	for _, want := range []string{
		"root = '" + filepath.Join(run, "containerd", "root") + "'",
		"state = '" + filepath.Join(run, "containerd", "state") + "'",
		"[plugins.'io.containerd.server.v1.grpc']\n    address = '" + c.containerdSocket + "'",
		"[plugins.'io.containerd.server.v1.ttrpc']\n    address = '" + c.containerdSocket + ".ttrpc'",
		"[plugins.'io.containerd.internal.v1.opt']\n    path = '" + filepath.Join(run, "containerd", "opt") + "'",
		"[plugins.'io.containerd.nri.v1.nri']\n    disable = true",
		"sandbox = 'docker.io/" + pauseImageName + "'",
		"[plugins.'io.containerd.cri.v1.images'.registry]\n      config_path = '" + c.RegistryHostsDir() + "'",
		"restrict_oom_score_adj = true",
		"max_container_log_line_size = 16384",
		"runtime_path = '" + filepath.Join(DefaultContainerdDir(), "containerd-shim-runc-v2") + "'",
		"Root = '" + filepath.Join(run, "runc") + "'",
		"SystemdCgroup = false",
		"bin_dirs = ['" + cniBinDir + "']",
		"conf_dir = '" + filepath.Join(run, "cni", "net.d") + "'",
		"stream_server_address = '127.0.0.1'",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("containerd's config (as it reads it) lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("containerd config dump:\n%s", stdout.String())
	}
}
