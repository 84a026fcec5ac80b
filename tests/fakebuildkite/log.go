package fakebuildkite

import (
	"regexp"
	"sort"
	"strconv"
	"time"
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

	// joined is what assemble returns for chunks[:unjoined], kept up to date as the log is
	// read and chunks arrive in offset order (the common case), and rebuilt only after one
	// arrives out of order. Every snapshot of a job reads the log, and tests wait on
	// snapshots taken at each change: without it a 20 MB log was re-joined for every
	// chunk, under the lock every request needs. It is extended when read, not as chunks
	// arrive, so that a log nobody reads until the end (a benchmark's 200 MB) is copied
	// once rather than grown chunk by chunk beside the chunks themselves.
	joined   []byte
	unjoined int   // chunks[unjoined:] are not in joined yet
	next     int64 // the offset just past the last chunk that arrived in order
	stale    bool  // a chunk arrived out of order: joined must be rebuilt
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
	if !l.stale && c.offset >= l.next {
		// Past every chunk so far: joining it gives what a full rebuild would.
		l.next = c.offset + int64(len(c.data))
	} else {
		l.stale = true
	}
	return true
}

// bytes returns the assembled log. Callers share it and must not change it; its capacity is
// its length, so an append by a caller copies rather than writes into the log.
func (l *chunkLog) bytes() []byte {
	if l.stale {
		l.joined, l.next = l.assemble()
		l.stale = false
	} else {
		size := len(l.joined)
		for _, c := range l.chunks[l.unjoined:] {
			size += len(c.data)
		}
		if size > cap(l.joined) {
			// Room for as much again, so that a log read as it grows is copied a few
			// times in all, not at every read.
			l.joined = append(make([]byte, 0, 2*size), l.joined...)
		}
		for _, c := range l.chunks[l.unjoined:] {
			l.joined = append(l.joined, c.data...)
		}
	}
	l.unjoined = len(l.chunks)
	return l.joined[:len(l.joined):len(l.joined)]
}

// assemble joins the chunks by offset. Bytes that overlap what came before are dropped, so a
// chunk resent at a different sequence number cannot duplicate output. It also returns the
// offset just past the last chunk.
func (l *chunkLog) assemble() ([]byte, int64) {
	cs := make([]chunk, len(l.chunks))
	copy(cs, l.chunks)
	sort.Slice(cs, func(a, b int) bool { return cs[a].offset < cs[b].offset })
	size := 0
	for _, c := range cs {
		size += len(c.data)
	}
	// At most the chunks' bytes: allocated once, not grown chunk by chunk (a 200 MB log
	// took seconds to join that way).
	out := make([]byte, 0, size)
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
	return out, next
}

var (
	// ansiRE matches CSI colour/cursor sequences and the agent's APC timestamps
	// (ESC _ bk;t=<ms> BEL).
	ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b_[^\x07]*\x07|\x1b\][^\x07]*\x07`)
	// timestampRE matches one inline timestamp, capturing its unix milliseconds.
	timestampRE = regexp.MustCompile(`\x1b_bk;t=([0-9]+)\x07`)
)

// TimedLog is PlainLog with each inline timestamp shown as the UI's time column shows it,
// "[15:04:05.000] " in UTC: what a failing test prints to tell where a job lost its time.
func TimedLog(b []byte) string {
	timed := timestampRE.ReplaceAllStringFunc(string(b), func(m string) string {
		ms, err := strconv.ParseInt(timestampRE.FindStringSubmatch(m)[1], 10, 64)
		if err != nil {
			return m
		}
		return time.UnixMilli(ms).UTC().Format("[15:04:05.000] ")
	})
	return PlainLog([]byte(timed))
}

// PlainLog strips ANSI escape sequences and Buildkite's inline timestamps from a log, leaving
// the text a person reads in the Buildkite UI.
func PlainLog(b []byte) string {
	return ansiRE.ReplaceAllString(string(b), "")
}
