// Package logstream turns a job's output into Buildkite log chunks: it adds Buildkite's inline
// timestamps at the start of every line, cuts the result into chunks of at most the job's
// chunk size, and uploads them in order, as the agent's log streamer does. A few chunks may
// be on their way at once (Config.Uploaders, as the agent's three uploaders), but they are
// settled strictly in order, so that "how far the log got" is always one exact sequence
// number and byte offset with nothing missing before it.
//
// Memory stays bounded whatever the output rate: when the uploader falls behind, Write blocks
// until a chunk has gone, which in turn blocks the process writing the output.
//
// With a Redactor, secrets are replaced before the output is stamped and cut into chunks,
// each source (the main output, each log file) on its own, so that a secret split across
// writes, chunks or polls of a file is still found. A chunk Buildkite refuses leaves a hole,
// and the log says so after it: a line naming the bytes that are missing.
package logstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
)

// UploadFunc sends one chunk. sequence counts from 1; offset is the uncompressed byte offset of
// data in the whole log. It returns once Buildkite has acknowledged the chunk or the chunk is
// lost for good (retries are the uploader's business, agentapi's UploadChunk does them).
type UploadFunc func(ctx context.Context, sequence, offset uint64, data []byte) error

// Stats says how far the log got.
type Stats struct {
	// Sequence is the sequence number of the last chunk settled (acknowledged or refused).
	Sequence uint64
	// Offset is the byte offset just past that chunk.
	Offset uint64
	// FailedChunks counts chunks that could not be delivered; their bytes are missing.
	FailedChunks int
	// LostBytes counts the bytes of those chunks.
	LostBytes uint64
}

// Config configures a Stream.
type Config struct {
	// MaxChunkBytes is the largest chunk Buildkite accepts (Job.chunks_max_size_bytes). Required.
	MaxChunkBytes int
	// Interval is how often pending output is sent when no chunk has filled up. Default 1 s.
	Interval time.Duration
	// Upload sends a chunk. Required.
	Upload UploadFunc
	// OnChunk, when set, is called after each chunk is settled, in sequence order, with the
	// new totals and the upload's error (nil when acknowledged). The supervisor records its
	// progress here, so that what it records is never ahead of Buildkite, nor behind it by
	// more than the chunks in flight.
	OnChunk func(Stats, error)
	// Uploaders is how many chunks may be on their way to Buildkite at once. Default 1: one
	// at a time, each sent once the one before is settled. With more, a chunk's compression
	// and round trip overlap the next one's, as with the agent's three uploaders; Buildkite
	// orders chunks by sequence and offset, and chunks are still settled (Stats, OnChunk) in
	// order, so the stats always say exactly how far the log got without a gap.
	Uploaders int
	// QueuedChunks is how many full chunks may wait behind the one being sent before Write
	// blocks. Default 4.
	QueuedChunks int
	// ResumeHeading, when set, is written (as its own line) when the main output continues after
	// a section written with WriteSection, so that it does not read as part of that section.
	ResumeHeading string
	// Redactor, when set, replaces secrets in everything written.
	Redactor *redact.Redactor
	// Now is the clock for timestamps; time.Now when nil.
	Now func() time.Time
}

// ErrClosed is returned by writes after Close, and by writes that were waiting when the stream
// was aborted.
var ErrClosed = errors.New("log stream closed")

// Stream is a job log on its way to Buildkite. Its methods are safe for concurrent use.
type Stream struct {
	conf Config

	// wmu serialises writers, so that a section (heading and content) is never interleaved
	// with other output. It is held while a writer waits for room, which is what blocks the
	// other writers too.
	wmu           sync.Mutex
	lineStart     bool      // the next byte starts a line (mu; writers hold wmu too)
	section       string    // heading of the section last written, "" for the main output (wmu)
	lastMainWrite time.Time // (wmu)
	tsMillis      int64     // millisecond of tsPrefix (wmu)
	tsPrefix      []byte    // cached timestamp prefix (wmu)
	// main redacts the main output, sections the content of each section, by heading (wmu
	// and mu). Each holds back what may be the start of a secret.
	main     *redact.Writer
	sections map[string]*redact.Writer

	mu      sync.Mutex
	cond    *sync.Cond
	cur     []byte   // the chunk being filled (mu)
	queue   [][]byte // full chunks waiting to be sent (mu)
	free    [][]byte // spare chunk buffers (mu)
	tick    bool     // the interval has passed: send what is pending (mu)
	closing bool     // no more writes; send everything and stop (mu)
	aborted bool     // stop at once, dropping what is pending (mu)
	stats   Stats    // (mu)
	// noWait lets the uploader add a notice without waiting for room in the queue (mu).
	noWait bool

	// Holes (mu): written counts the bytes put into chunks; untold is what Buildkite refused
	// that no notice describes yet; told is what the last notice, from byte noticeFrom to
	// noticeAt, describes, until the chunks holding it are settled; failStreak counts
	// refusals in a row.
	written    uint64
	untold     hole
	told       hole
	noticeFrom uint64
	noticeAt   uint64
	failStreak int

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// New starts a stream; its uploader runs until Close.
func New(conf Config) (*Stream, error) {
	if conf.MaxChunkBytes <= 0 {
		return nil, fmt.Errorf("log chunk size is %d: it must be more than 0 (Buildkite sends it as chunks_max_size_bytes)", conf.MaxChunkBytes)
	}
	if conf.Upload == nil {
		return nil, errors.New("log stream needs an upload function")
	}
	if conf.Interval <= 0 {
		conf.Interval = time.Second
	}
	if conf.QueuedChunks <= 0 {
		conf.QueuedChunks = 4
	}
	if conf.Uploaders <= 0 {
		conf.Uploaders = 1
	}
	if conf.Now == nil {
		conf.Now = time.Now
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stream{conf: conf, lineStart: true, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	if !conf.Redactor.Empty() {
		s.main = conf.Redactor.NewWriter(lockedText{s})
		s.sections = map[string]*redact.Writer{}
	}
	go s.upload()
	go s.ticker()
	return s, nil
}

// Stats returns how far the log got.
func (s *Stream) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close sends everything written so far and stops the stream. When ctx ends first, the rest
// is dropped (Abort) and ctx's error returned; the stats then cover what was settled.
func (s *Stream) Close(ctx context.Context) (Stats, error) {
	closed := make(chan struct{})
	go func() {
		// Taking wmu waits for a writer that is blocked for room; ctx bounds that wait below.
		s.wmu.Lock()
		s.mu.Lock()
		if !s.closing && !s.aborted {
			_ = s.flushAllLocked() // only fails when aborted
		}
		s.closing = true
		s.cond.Broadcast()
		s.mu.Unlock()
		s.wmu.Unlock()
		close(closed)
	}()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.Abort()
		<-s.done
		return s.Stats(), fmt.Errorf("sending the rest of the log: %w", ctx.Err())
	}
	<-closed
	return s.Stats(), nil
}

// Abort stops the stream at once: the chunk being sent is cut short and pending output is
// dropped. Writers waiting for room get ErrClosed.
func (s *Stream) Abort() {
	s.mu.Lock()
	s.aborted = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.cancel()
}
