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

// TestInstallCopiesTheAgent: with --agent, the init container also puts buildkite-agent
// beside the supervisor, where the supervisor runs it from (podcontract.AgentPath); with
// --supervisor, the supervisor it copies is agentd-supervise, not agentd.
func TestInstallCopiesTheAgent(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "agentd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	standIn := func(name string) string {
		path := filepath.Join(dir, "image", name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\necho "+name+" stand-in\n"), 0o700))
		return path
	}
	agent, supervisor := standIn("buildkite-agent"), standIn("agentd-supervise")
	missing := filepath.Join(dir, "image", "missing")

	cases := []struct {
		name       string
		agent      string
		supervisor string
		wantErr    string
	}{
		{name: "agentd and the agent", agent: agent},
		{name: "agentd-supervise and the agent", agent: agent, supervisor: supervisor},
		{name: "an operator image without the agent", agent: missing, supervisor: supervisor,
			wantErr: "the operator image has no buildkite-agent at"},
		{name: "an operator image without agentd-supervise", agent: agent, supervisor: missing,
			wantErr: "the operator image has no agentd-supervise at"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(dir, "vol"+strconv.Itoa(i), "agentd-supervise")
			args := []string{"install", "--agent", tc.agent}
			wantDest := bin
			if tc.supervisor != "" {
				args = append(args, "--supervisor", tc.supervisor)
				wantDest = tc.supervisor
			}
			out, err := exec.Command(bin, append(args, dest)...).CombinedOutput()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, string(out), tc.wantErr)
				_, err := os.Stat(filepath.Dir(dest))
				assert.True(t, os.IsNotExist(err), "something was copied before the error")
				return
			}
			require.NoError(t, err, "%s", out)
			for src, dst := range map[string]string{wantDest: dest, agent: filepath.Join(filepath.Dir(dest), "buildkite-agent")} {
				want, err := os.ReadFile(src)
				require.NoError(t, err)
				got, err := os.ReadFile(dst)
				require.NoError(t, err)
				assert.True(t, bytes.Equal(want, got), "%s differs from %s", dst, src)
				info, err := os.Stat(dst)
				require.NoError(t, err)
				assert.Equal(t, os.FileMode(0o755), info.Mode().Perm(), dst)
			}
			out, err = exec.Command(filepath.Join(filepath.Dir(dest), "buildkite-agent")).CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.Equal(t, "buildkite-agent stand-in\n", string(out))
		})
	}
}

func TestInstallUsage(t *testing.T) {
	assert.Error(t, runInstall(nil))
	assert.Error(t, runInstall([]string{"a", "b"}))
	assert.Error(t, runInstall([]string{"--agent", "x"}))
	err := install(filepath.Join(t.TempDir(), "missing"), filepath.Join(t.TempDir(), "agentd"))
	assert.ErrorContains(t, err, "opening")
}
