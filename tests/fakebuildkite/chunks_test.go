package fakebuildkite

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// split cuts log into chunks of at most n bytes, numbered from 1 as the agent numbers them.
func split(log []byte, n int) []chunk {
	var out []chunk
	for off := 0; off < len(log); off += n {
		end := min(off+n, len(log))
		out = append(out, chunk{sequence: len(out) + 1, offset: int64(off), data: log[off:end]})
	}
	return out
}

func TestChunkLogReassembly(t *testing.T) {
	log := []byte("line one\nline two\nünïcødé line three\n\x1b[31mred\x1b[0m\n")
	cs := split(log, 7)
	tests := []struct {
		name  string
		order []chunk
		want  []byte
		added int
	}{
		{"in order", cs, log, len(cs)},
		{"reversed", reversed(cs), log, len(cs)},
		{"shuffled", shuffled(cs, 1), log, len(cs)},
		{"every chunk twice", append(shuffled(cs, 2), shuffled(cs, 3)...), log, len(cs)},
		{"same offset under a new sequence", append(append([]chunk{}, cs...), chunk{sequence: 99, offset: cs[1].offset, data: cs[1].data}), log, len(cs)},
		{"overlapping resend", append(append([]chunk{}, cs...), chunk{sequence: 100, offset: 3, data: log[3:12]}), log, len(cs) + 1},
		{"missing chunk leaves a gap", append(append([]chunk{}, cs[:2]...), cs[3:]...), append(append([]byte{}, log[:14]...), log[21:]...), len(cs) - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l chunkLog
			added := 0
			for i, c := range tt.order {
				if l.add(c) {
					added++
				}
				// The log kept up to date as chunks arrive is what a rebuild from all of them gives.
				rebuilt, _ := l.assemble()
				require.Equal(t, string(rebuilt), string(l.bytes()), "after chunk %d", i)
			}
			assert.Equal(t, tt.added, added)
			assert.Equal(t, string(tt.want), string(l.bytes()))
		})
	}
}

func reversed(cs []chunk) []chunk {
	out := make([]chunk, len(cs))
	for i, c := range cs {
		out[len(cs)-1-i] = c
	}
	return out
}

func shuffled(cs []chunk, seed uint64) []chunk {
	out := append([]chunk(nil), cs...)
	r := rand.New(rand.NewPCG(seed, seed))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// TestChunksOverHTTP sends a log out of order and with duplicates through the endpoint.
func TestChunksOverHTTP(t *testing.T) {
	s := startFake(t, Options{ChunksMaxSizeBytes: 64})
	_, j := startedJob(t, s, oneStep)
	var log bytes.Buffer
	for i := range 40 {
		fmt.Fprintf(&log, "output line %d\n", i)
	}
	cs := split(log.Bytes(), 64)
	for _, c := range append(shuffled(cs, 7), cs[0], cs[len(cs)-1]) {
		r := postChunk(t, s, j.ID, j.Token, c.sequence, int(c.offset), c.data)
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	}
	snap, _ := s.Job(j.ID)
	assert.Equal(t, log.String(), string(snap.Log))
	assert.Equal(t, len(cs), snap.ChunkCount)
}

func TestChunkErrors(t *testing.T) {
	s := startFake(t, Options{ChunksMaxSizeBytes: 16})
	_, j := startedJob(t, s, oneStep)
	url := func(q string) string { return s.Endpoint() + "/jobs/" + j.ID + "/chunks" + q }

	t.Run("not gzip", func(t *testing.T) {
		req, err := http.NewRequest("POST", url("?sequence=1&offset=0&size=2"), bytes.NewReader([]byte("hi")))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Token "+j.Token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	})
	tests := []struct {
		name  string
		seq   int
		off   int
		data  []byte
		token string
		want  int
	}{
		{"ok", 1, 0, []byte("0123456789"), j.Token, 201},
		{"larger than chunks_max_size_bytes", 2, 10, []byte("0123456789abcdefg"), j.Token, 422},
		{"access token", 3, 10, []byte("x"), "", 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := postChunk(t, s, j.ID, tt.token, tt.seq, tt.off, tt.data)
			assert.Equal(t, tt.want, r.status, "body: %s", r.body)
		})
	}
	t.Run("size mismatch", func(t *testing.T) {
		r := call(t, s, "POST", "/jobs/"+j.ID+"/chunks?sequence=5&offset=0&size=9", j.Token, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status)
	})
	t.Run("missing sequence", func(t *testing.T) {
		r := call(t, s, "POST", "/jobs/"+j.ID+"/chunks?offset=0&size=1", j.Token, nil)
		assert.Equal(t, http.StatusUnprocessableEntity, r.status)
	})
	t.Run("after finish", func(t *testing.T) {
		require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+j.ID+"/finish", j.Token, map[string]string{"exit_status": "0"}).status)
		r := postChunk(t, s, j.ID, j.Token, 9, 10, []byte("late"))
		assert.Equal(t, http.StatusUnprocessableEntity, r.status)
	})
	snap, _ := s.Job(j.ID)
	assert.Equal(t, "0123456789", string(snap.Log))
}

func TestPlainLog(t *testing.T) {
	tests := []struct{ in, want string }{
		{"\x1b_bk;t=1795358491916\x07~~~ Running commands\r\n", "~~~ Running commands\r\n"},
		{"\x1b[90m$\x1b[0m echo hi\n", "$ echo hi\n"},
		{"plain", "plain"},
		{"\x1b[1;31mbold red\x1b[0m", "bold red"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, PlainLog([]byte(tt.in)))
	}
}

func TestTimedLog(t *testing.T) {
	tests := []struct{ in, want string }{
		// 1795358491916 ms is 2026-11-22T14:41:31.916Z.
		{"\x1b_bk;t=1795358491916\x07~~~ Running commands\n", "[14:41:31.916] ~~~ Running commands\n"},
		{"\x1b_bk;t=1795358491916\x07a\n\x1b_bk;t=1795358492000\x07\x1b[31mb\x1b[0m\n", "[14:41:31.916] a\n[14:41:32.000] b\n"},
		{"no timestamps\n", "no timestamps\n"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, TimedLog([]byte(tt.in)))
	}
}
