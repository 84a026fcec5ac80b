package fakebuildkite

import (
	"regexp"
	"sort"
)

// chunk is one uploaded piece of a job log, decompressed.
type chunk struct {
	sequence int
	offset   int64
	data     []byte
}

// chunkLog holds a job's chunks. The agent uploads with three workers, so chunks arrive in any
// order; a retried upload can arrive twice. Buildkite keys them by sequence and orders them by
// offset, and so does this.
type chunkLog struct {
	chunks []chunk
	seqs   map[int]bool
	offs   map[int64]bool
}

// add stores a chunk and reports whether it was new (false for a duplicate).
func (l *chunkLog) add(c chunk) bool {
	if l.seqs == nil {
		l.seqs, l.offs = map[int]bool{}, map[int64]bool{}
	}
	if l.seqs[c.sequence] || l.offs[c.offset] {
		return false
	}
	l.seqs[c.sequence], l.offs[c.offset] = true, true
	l.chunks = append(l.chunks, c)
	return true
}

// assemble joins the chunks by offset. Bytes that overlap what came before are dropped, so a
// chunk resent at a different sequence number cannot duplicate output.
func (l *chunkLog) assemble() []byte {
	cs := make([]chunk, len(l.chunks))
	copy(cs, l.chunks)
	sort.Slice(cs, func(a, b int) bool { return cs[a].offset < cs[b].offset })
	var out []byte
	var next int64 // the offset just past the bytes appended so far
	for _, c := range cs {
		end := c.offset + int64(len(c.data))
		switch {
		case end <= next:
			continue
		case c.offset < next:
			out = append(out, c.data[next-c.offset:]...)
		default:
			// A gap (a chunk never arrived) is left out rather than zero-filled: the bytes that did
			// arrive stay in order, and tests comparing logs see the loss.
			out = append(out, c.data...)
		}
		next = end
	}
	return out
}

var (
	// ansiRE matches CSI colour/cursor sequences and the agent's APC timestamps
	// (ESC _ bk;t=<ms> BEL).
	ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b_[^\x07]*\x07|\x1b\][^\x07]*\x07`)
)

// PlainLog strips ANSI escape sequences and Buildkite's inline timestamps from a log, leaving
// the text a person reads in the Buildkite UI.
func PlainLog(b []byte) string {
	return ansiRE.ReplaceAllString(string(b), "")
}
