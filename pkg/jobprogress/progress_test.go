package jobprogress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	cases := []Progress{
		{},
		{Started: true, Sequence: 12, Offset: 1 << 33, FailedChunks: 1},
		{Started: true, Exited: true, ExitStatus: -1, Signal: "SIGKILL", SignalReason: "cancel", Flushed: true},
	}
	for _, p := range cases {
		path := filepath.Join(t.TempDir(), "termination-log")
		require.NoError(t, Write(path, p))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		got, err := Decode(string(b))
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
}

func TestLongErrorIsCutToFit(t *testing.T) {
	b, err := Progress{Error: strings.Repeat("x", 10_000)}.Encode()
	require.NoError(t, err)
	assert.LessOrEqual(t, len(b), MaxSize)
}

func TestDecodeGarbageSaysWhere(t *testing.T) {
	_, err := Decode("OOMKilled")
	require.ErrorContains(t, err, "termination message")
}

// TestOverwriteInPlace follows the records of one job through the termination message, which
// is written in place: each read finds the newest whole record, and the file never shrinks
// (it is never truncated, so no moment leaves it empty).
func TestOverwriteInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "termination-log")
	require.NoError(t, os.WriteFile(path, nil, 0o644)) // as the kubelet creates it
	records := []Progress{
		{Started: true},
		{Started: true, Error: strings.Repeat("long error ", 20)},
		{Started: true, Sequence: 3, Offset: 4096},
		{Started: true, Sequence: 4, Offset: 5000, Exited: true, Flushed: true},
	}
	size := 0
	for i, p := range records {
		b, err := p.Encode()
		require.NoError(t, err)
		require.NoError(t, overwrite(path, b))
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, len(raw), size, "record %d: the file shrank", i)
		size = len(raw)
		got, err := Decode(string(raw))
		require.NoError(t, err, "record %d: %q", i, raw)
		assert.Equal(t, p, got, "record %d", i)
	}
}
