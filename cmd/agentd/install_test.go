package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInstallCopiesItself(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "agentd")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cases := []struct {
		name string
		dest string
		// existing is put at dest first: a rerun of the init container replaces it.
		existing []byte
	}{
		{"into an empty volume", filepath.Join(dir, "vol1", "agentd"), nil},
		{"into a folder that does not exist yet", filepath.Join(dir, "vol2", "deeper", "agentd"), nil},
		{"over an earlier copy", filepath.Join(dir, "vol3", "agentd"), []byte("half a binary")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.existing != nil {
				require.NoError(t, os.MkdirAll(filepath.Dir(tc.dest), 0o755))
				require.NoError(t, os.WriteFile(tc.dest, tc.existing, 0o600))
			}
			out, err := exec.Command(bin, "install", tc.dest).CombinedOutput()
			require.NoError(t, err, "%s", out)

			want, err := os.ReadFile(bin)
			require.NoError(t, err)
			got, err := os.ReadFile(tc.dest)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, got), "installed copy differs from agentd")
			info, err := os.Stat(tc.dest)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())
			entries, err := os.ReadDir(filepath.Dir(tc.dest))
			require.NoError(t, err)
			assert.Len(t, entries, 1, "a temporary file was left behind")

			// The copy runs: it is agentd.
			out, err = exec.Command(tc.dest, "version").CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.Contains(t, string(out), "agentd")
		})
	}
}

// TestInstallCopiesTheSupervisor: with --supervisor, the init container copies
// agentd-supervise, not agentd, and fails before copying anything when the image lacks it.
// buildkite-agent is no longer the operator image's: --agent is refused.
func TestInstallCopiesTheSupervisor(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "agentd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	supervisor := filepath.Join(dir, "image", "agentd-supervise")
	require.NoError(t, os.MkdirAll(filepath.Dir(supervisor), 0o755))
	require.NoError(t, os.WriteFile(supervisor, []byte("#!/bin/sh\necho agentd-supervise stand-in\n"), 0o700))
	missing := filepath.Join(dir, "image", "missing")

	cases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "agentd-supervise", args: []string{"--supervisor", supervisor}},
		{name: "an operator image without agentd-supervise", args: []string{"--supervisor", missing},
			wantErr: "the operator image has no agentd-supervise at"},
		{name: "the agent, which the agent's image brings now", args: []string{"--agent", supervisor, "--supervisor", supervisor},
			wantErr: "flag provided but not defined: -agent"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(dir, "vol"+strconv.Itoa(i), "agentd-supervise")
			out, err := exec.Command(bin, append(append([]string{"install"}, tc.args...), dest)...).CombinedOutput()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, string(out), tc.wantErr)
				_, err := os.Stat(filepath.Dir(dest))
				assert.True(t, os.IsNotExist(err), "something was copied before the error")
				return
			}
			require.NoError(t, err, "%s", out)
			entries, err := os.ReadDir(filepath.Dir(dest))
			require.NoError(t, err)
			assert.Len(t, entries, 1, "only the supervisor is installed")
			info, err := os.Stat(dest)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())
			out, err = exec.Command(dest).CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.Equal(t, "agentd-supervise stand-in\n", string(out))
		})
	}
}

func TestInstallUsage(t *testing.T) {
	assert.Error(t, runInstall(nil))
	assert.Error(t, runInstall([]string{"a", "b"}))
	assert.Error(t, runInstall([]string{"--agent", "x", "dest"}), "--agent is gone")
	// The copy itself, a source that cannot be opened included: pkg/install's TestExecutable.
}
