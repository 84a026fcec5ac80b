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
