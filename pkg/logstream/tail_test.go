package logstream

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTailFollowsRotation: a log file rotated by rename and create is read from the start of
// the new file, even when the new file is already longer than what was read of the old one
// (by path and size alone, that looks like growth, and its first bytes were skipped); the
// old file's last lines, written just before the rename, are not lost either.
func TestTailFollowsRotation(t *testing.T) {
	tests := []struct {
		name string
		// rotate replaces the file at path; it is called after the tailer has read "old 1".
		rotate func(t *testing.T, path string)
		want   []string
	}{
		{
			name: "rename and create, the new file longer than the old offset",
			rotate: func(t *testing.T, path string) {
				require.NoError(t, os.Rename(path, path+".1"))
				require.NoError(t, os.WriteFile(path, []byte("new 1 is a longer line than the old file ever was\nnew 2\n"), 0o644))
			},
			want: []string{"old 1\n", "new 1 is a longer line than the old file ever was\nnew 2\n"},
		},
		{
			name: "the old file's last lines, written just before the rename",
			rotate: func(t *testing.T, path string) {
				appendTo(t, path, "old 2 written last\n")
				require.NoError(t, os.Rename(path, path+".1"))
				require.NoError(t, os.WriteFile(path, []byte("new 1 is a longer line than the old file ever was\n"), 0o644))
			},
			want: []string{"old 1\n", "old 2 written last\n", "new 1 is a longer line than the old file ever was\n"},
		},
		{
			name: "copy and truncate, then a longer write",
			rotate: func(t *testing.T, path string) {
				require.NoError(t, os.Truncate(path, 0))
				appendTo(t, path, "after truncation\n")
			},
			want: []string{"old 1\n", "after truncation\n"},
		},
		{
			name: "deleted and created again",
			rotate: func(t *testing.T, path string) {
				require.NoError(t, os.Remove(path))
				require.NoError(t, os.WriteFile(path, []byte("recreated, and longer than before\n"), 0o644))
			},
			want: []string{"old 1\n", "recreated, and longer than before\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "service.log")
			require.NoError(t, os.WriteFile(path, []byte("old 1\n"), 0o644))
			rec := &recorder{}
			s, err := New(Config{MaxChunkBytes: 1 << 20, Interval: 10 * time.Millisecond, Upload: rec.upload})
			require.NoError(t, err)
			tl := TailFiles(s, []string{path}, 20*time.Millisecond, t.Logf)
			require.Eventually(t, func() bool { return strings.Contains(stripTimestamps(t, rec.joined()), "old 1\n") },
				10*time.Second, 10*time.Millisecond)
			// Hold the tailer between polls while the file is rotated, as happens when
			// rotation falls between two polls.
			tl.mu.Lock()
			tt.rotate(t, path)
			tl.mu.Unlock()
			tl.Stop()
			_, err = s.Close(context.Background())
			require.NoError(t, err)
			want := FileHeading(path) + "\n" + strings.Join(tt.want, "")
			assert.Equal(t, want, stripTimestamps(t, rec.joined()))
		})
	}
}

func appendTo(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(text)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}
