package preflight

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadAPIToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	for _, tc := range []struct {
		name, path, want, err string
	}{
		{name: "a token with the newline a Secret often has", path: write("nl", "bkua_abc\n"), want: "bkua_abc"},
		{name: "blanks around it", path: write("blanks", "  bkua_abc \t\n"), want: "bkua_abc"},
		{name: "an empty file", path: write("empty", ""), err: "is empty"},
		{name: "only blanks", path: write("blank", " \n"), err: "is empty"},
		{name: "no such file", path: filepath.Join(dir, "missing"), err: "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadAPIToken(tc.path)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				assert.Empty(t, got)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	_, err := ReadAPIToken(filepath.Join(dir, "missing"))
	assert.ErrorIs(t, err, fs.ErrNotExist, "the file's error is wrapped as it came")
}
