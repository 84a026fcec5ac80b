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
		{Started: true, Sequence: 9, Offset: 1 << 20, FailedChunks: 2, LostBytes: 204800},
		{EndedOnBuildkite: true, BuildkiteState: "canceled"},
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

// FuzzDecode reads termination messages, which anything in the job's container can write:
// Decode never panics, and what it accepts encodes and decodes to itself. The seed corpus is
// in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	f.Add(`{"started":true,"seq":3,"offset":4096}`)
	f.Add("")
	f.Add("OOMKilled")
	f.Add(`{"seq":-1}`)
	f.Fuzz(func(t *testing.T, msg string) {
		p, err := Decode(msg)
		if err != nil {
			return
		}
		b, err := p.Encode()
		if err != nil {
			return // too large for a termination message: the supervisor never writes it
		}
		again, err := Decode(string(b))
		if err != nil {
			t.Fatalf("%q decodes, its encoding %q does not: %v", msg, b, err)
		}
		if len(p.Error) <= 1024 && again != p {
			t.Fatalf("%q: %+v, after a round trip %+v", msg, p, again)
		}
	})
}

// TestFileKeptOpen: records written through one open File replace each other in place, a
// shorter one padded so that no tail of a longer one is left behind.
func TestFileKeptOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "termination-log")
	f, err := Open(path)
	require.NoError(t, err)
	records := []Progress{
		{Started: true, Error: strings.Repeat("long error ", 20)},
		{Started: true, Sequence: 1},
		{Started: true, Sequence: 2, Offset: 4096, Exited: true, Flushed: true},
	}
	for i, p := range records {
		require.NoError(t, f.Write(p))
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		got, err := Decode(string(raw))
		require.NoError(t, err, "record %d: %q", i, raw)
		assert.Equal(t, p, got, "record %d", i)
	}
	require.NoError(t, f.Close())
}
