package logstream

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
)

// FuzzStream writes any output, cut into writes anywhere, through a stream with small
// chunks and redaction: what is sent is the output redacted in one go, with one timestamp at
// the start of each line, in chunks no larger than the maximum, at consecutive offsets. The
// seed corpus is in testdata/fuzz/FuzzStream.
func FuzzStream(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), "", uint64(1), uint8(16))
	f.Add([]byte("pw=hunter2-secret\nand again hunter2-secret"), "hunter2-secret", uint64(2), uint8(25))
	f.Add([]byte("\x1b_bk;t=1\a\n\n\r\n\x00binary\xff"), "binary\xff", uint64(3), uint8(1))
	f.Fuzz(func(t *testing.T, out []byte, secret string, seed uint64, max uint8) {
		maxChunk := 22 + int(max) // room for a timestamp, which is never split
		r := redact.New(secret)
		rec := &recorder{}
		s, err := New(Config{MaxChunkBytes: maxChunk, Interval: time.Hour, Upload: rec.upload, Now: fixedClock(1700000000000), Redactor: r,
			Uploaders: 1 + int(seed%3)})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 7))
		for p := out; len(p) > 0; {
			n := 1 + rng.IntN(len(p))
			if _, err := s.Write(p[:n]); err != nil {
				t.Fatal(err)
			}
			p = p[n:]
		}
		stats, err := s.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var off uint64
		want := layout(r.String(string(out)), ts(1700000000000), maxChunk)
		for i, c := range rec.all() {
			if c.seq != uint64(i+1) || c.off != off || len(c.data) > maxChunk {
				t.Fatalf("chunk %d: seq %d offset %d (want %d), %d bytes (max %d)", i, c.seq, c.off, off, len(c.data), maxChunk)
			}
			if i >= len(want) || string(c.data) != want[i] {
				t.Fatalf("chunk %d is %q, want the chunks %q", i, c.data, want)
			}
			off += uint64(len(c.data))
		}
		if len(rec.all()) != len(want) {
			t.Fatalf("%d chunks sent, want %d", len(rec.all()), len(want))
		}
		if stats.Offset != off {
			t.Fatalf("stats say %d bytes, %d sent", stats.Offset, off)
		}
		if got, want := stripTimestamps(t, rec.joined()), r.String(string(out)); got != want {
			t.Fatalf("sent %q, want %q", got, want)
		}
	})
}

// layout is how the stream cuts text into chunks of at most max bytes, stamp before each
// line, whatever the writes were: every chunk as full as it can be, except that a stamp
// that does not fit whole in the chunk being filled starts the next one.
func layout(text, stamp string, max int) []string {
	var chunks []string
	cur := ""
	for _, line := range strings.SplitAfter(text, "\n") {
		if line == "" {
			continue
		}
		if cur != "" && len(cur)+len(stamp) > max {
			chunks, cur = append(chunks, cur), ""
		}
		for rest := stamp + line; rest != ""; {
			n := min(max-len(cur), len(rest))
			cur, rest = cur+rest[:n], rest[n:]
			if len(cur) == max {
				chunks, cur = append(chunks, cur), ""
			}
		}
	}
	if cur != "" {
		chunks = append(chunks, cur)
	}
	return chunks
}
