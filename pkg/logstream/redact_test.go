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

	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
)

// TestRedaction: secrets become [REDACTED] in what is sent, whichever way the output is cut
// into writes and chunks, in the main output, the supervisor's own lines and log files.
func TestRedaction(t *testing.T) {
	const secret = "hunter2-is-my-password"
	const token = "bkaj_0123456789abcdefghij"
	tests := []struct {
		name    string
		max     int // chunk size
		writes  []string
		line    string // a line of the supervisor's own, written after the writes
		file    string // the content of a log file tailed
		want    string // the log, timestamps stripped
		holdsNo bool
	}{
		{name: "in one write", max: 1 << 20, writes: []string{"pw=" + secret + "\n"}, want: "pw=[REDACTED]\n"},
		{
			name: "split across two writes", max: 1 << 20,
			writes: []string{"pw=" + secret[:7], secret[7:] + " and " + token[:3], token[3:] + "\n"},
			want:   "pw=[REDACTED] and [REDACTED]\n",
		},
		{
			name: "split across chunks: redacted before it is cut", max: 32,
			writes: []string{"some output first, then pw=" + secret + "\n"},
			want:   "some output first, then pw=[REDACTED]\n",
		},
		{
			name: "held back until the output ends, then written", max: 1 << 20,
			writes: []string{"ends with the start of a secret: hunter"},
			want:   "ends with the start of a secret: hunter",
		},
		{name: "the supervisor's own lines", max: 1 << 20, line: "$ deploy --password " + secret, want: "$ deploy --password [REDACTED]\n"},
		{
			name: "a log file", max: 1 << 20, file: "token " + token + "\n",
			want: "--- :page_facing_up: FILE\ntoken [REDACTED]\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			s, err := New(Config{MaxChunkBytes: tt.max, Interval: time.Hour, Upload: rec.upload, Now: fixedClock(1),
				Redactor: redact.New(secret, token)})
			require.NoError(t, err)
			for _, w := range tt.writes {
				n, err := s.Write([]byte(w))
				require.NoError(t, err)
				assert.Equal(t, len(w), n)
			}
			require.NoError(t, s.FlushOutput())
			if tt.line != "" {
				require.NoError(t, s.WriteLine(tt.line))
			}
			var file string
			if tt.file != "" {
				file = filepath.Join(t.TempDir(), "app.log")
				require.NoError(t, os.WriteFile(file, []byte(tt.file), 0o644))
				tl := TailFiles(s, []string{file}, time.Hour, t.Logf)
				tl.Stop()
			}
			_, err = s.Close(context.Background())
			require.NoError(t, err)
			sent := rec.joined()
			for _, c := range rec.all() {
				assert.LessOrEqual(t, len(c.data), tt.max)
			}
			want := strings.ReplaceAll(tt.want, "FILE", file)
			assert.Equal(t, want, stripTimestamps(t, sent))
			assert.NotContains(t, string(sent), secret)
			assert.NotContains(t, string(sent), token)
		})
	}
}

// TestRedactionHoldsBackAtMostOneSecret: what the stream holds back for redaction is
// bounded by the longest secret, whatever the output.
func TestRedactionHoldsBackAtMostOneSecret(t *testing.T) {
	rec := &recorder{}
	r := redact.New("abcdefghijklmnop")
	s, err := New(Config{MaxChunkBytes: 1 << 20, Interval: time.Hour, Upload: rec.upload, Redactor: r})
	require.NoError(t, err)
	for range 1000 {
		_, err := s.Write([]byte("abcdefghijklmno")) // always one byte short of the secret
		require.NoError(t, err)
		assert.LessOrEqual(t, s.main.Held(), r.MaxHold())
	}
	_, err = s.Close(context.Background())
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("abcdefghijklmno", 1000), stripTimestamps(t, rec.joined()))
}
