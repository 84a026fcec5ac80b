package install

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The copy is whole, executable whatever the source's mode, alone in its folder (no
// temporary file left), and replaces an earlier copy; a source that cannot be read leaves
// nothing behind.
func TestExecutable(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src", "agentd-supervise")
	content := []byte("#!/bin/sh\necho supervisor\n")
	require.NoError(t, os.MkdirAll(filepath.Dir(src), 0o755))
	require.NoError(t, os.WriteFile(src, content, 0o600))

	cases := []struct {
		name string
		src  string
		dest string
		// existing is put at dest first: a rerun of the init container replaces it.
		existing []byte
		wantErr  string
	}{
		{name: "into an empty volume", src: src, dest: filepath.Join(dir, "vol1", "agentd-supervise")},
		{name: "into a folder that does not exist yet", src: src, dest: filepath.Join(dir, "vol2", "deeper", "agentd-supervise")},
		{name: "over an earlier copy", src: src, dest: filepath.Join(dir, "vol3", "agentd-supervise"), existing: []byte("half a binary")},
		{name: "no source", src: filepath.Join(dir, "missing"), dest: filepath.Join(dir, "vol4", "agentd"), wantErr: "opening"},
		{name: "a source that is a folder", src: dir, dest: filepath.Join(dir, "vol5", "agentd"), wantErr: "copying"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.existing != nil {
				require.NoError(t, os.MkdirAll(filepath.Dir(tc.dest), 0o755))
				require.NoError(t, os.WriteFile(tc.dest, tc.existing, 0o600))
			}
			err := Executable(tc.src, tc.dest)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				entries, _ := os.ReadDir(filepath.Dir(tc.dest))
				assert.Empty(t, entries, "something was left behind")
				return
			}
			require.NoError(t, err)
			got, err := os.ReadFile(tc.dest)
			require.NoError(t, err)
			assert.Equal(t, content, got, "installed copy differs from its source")
			info, err := os.Stat(tc.dest)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())
			entries, err := os.ReadDir(filepath.Dir(tc.dest))
			require.NoError(t, err)
			assert.Len(t, entries, 1, "a temporary file was left behind")
		})
	}
}
