package plugin_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireTool fails (not skips: CI must run these checks) when a Debian tool is missing.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	require.NoError(t, err, "%s is not installed: run `make test-deps` (or apt-get install -y bats bats-assert bats-support shellcheck)", name)
	return p
}

// TestBats runs the bats suite of hooks/environment (plugin/tests/*.bats).
func TestBats(t *testing.T) {
	bats := requireTool(t, "bats")
	for _, lib := range []string{"bats-support", "bats-assert"} {
		matches, _ := filepath.Glob("/usr/lib/bats/" + lib + "/load.bash")
		require.NotEmpty(t, matches, "%s is not installed: run `make test-deps` (or apt-get install -y %s)", lib, lib)
	}
	out, err := exec.Command(bats, "--tap", "tests").CombinedOutput()
	require.NoError(t, err, "bats plugin/tests failed:\n%s", out)
	require.Contains(t, string(out), "ok 1 ", "bats ran no tests:\n%s", out)
	t.Logf("bats:\n%s", out)
}

// TestShellcheck keeps the hooks and the test stub shellcheck clean.
func TestShellcheck(t *testing.T) {
	shellcheck := requireTool(t, "shellcheck")
	files, err := filepath.Glob("../hooks/*")
	require.NoError(t, err)
	require.NotEmpty(t, files, "no hooks found in ../hooks")
	stubs, err := filepath.Glob("tests/stubs/*")
	require.NoError(t, err)
	out, err := exec.Command(shellcheck, append(files, stubs...)...).CombinedOutput()
	require.NoError(t, err, "shellcheck found problems:\n%s", out)
}
