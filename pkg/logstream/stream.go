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
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// sectionHoldoff is how long WriteSection waits for the main output to finish a line before
// it breaks the line to insert its section.
const sectionHoldoff = time.Second

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

// Write adds the job's main output to the log. It blocks while the uploader is behind.
func (s *Stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.lastMainWrite = s.conf.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(); err != nil {
		return 0, err
	}
	if len(p) > 0 {
		if err := s.resumeLocked(); err != nil {
			return 0, err
		}
	}
	var err error
	if s.main != nil {
		_, err = s.main.Write(p)
	} else {
		err = s.textLocked(p)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// FlushOutput writes what redaction holds back of the main output (the start of a secret,
// maybe): call it when the process writing the output has ended.
func (s *Stream) FlushOutput() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(); err != nil {
		return err
	}
	return s.flushMainLocked()
}

func (s *Stream) flushMainLocked() error {
	if s.main == nil || s.main.Held() == 0 {
		return nil
	}
	if err := s.resumeLocked(); err != nil {
		return err
	}
	return s.main.Flush()
}

// resumeLocked marks the main output continuing after a section. Call with wmu and mu held.
func (s *Stream) resumeLocked() error {
	if s.section == "" {
		return nil
	}
	s.section = ""
	if s.conf.ResumeHeading == "" {
		return nil
	}
	if !s.lineStart {
		if err := s.textLocked([]byte{'\n'}); err != nil {
			return err
		}
	}
	return s.textLocked([]byte(s.conf.ResumeHeading + "\n"))
}

// openLocked refuses writes once the stream is closing, and first writes the notice of a
// hole Buildkite left in the log, if one is due. Call with wmu and mu held.
func (s *Stream) openLocked() error {
	if s.closing || s.aborted {
		return ErrClosed
	}
	if s.noticeDueLocked() {
		return s.noticeLocked()
	}
	return nil
}

// lockedText writes to the stream with wmu and mu held: the destination of the redactors.
type lockedText struct{ s *Stream }

func (l lockedText) Write(p []byte) (int, error) {
	if err := l.s.textLocked(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteLine adds a line of the supervisor's own (a notice such as "job canceled") on a line of
// its own: when the main output is in the middle of a line, that line is ended first.
func (s *Stream) WriteLine(line string) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(); err != nil {
		return err
	}
	if !s.lineStart {
		if err := s.textLocked([]byte{'\n'}); err != nil {
			return err
		}
	}
	return s.textLocked([]byte(s.conf.Redactor.String(line) + "\n"))
}

// WriteSection adds p, the content of another source such as a log file, under heading (a
// whole line such as "--- :page_facing_up: /workspace/service.log"); the heading is written
// only when the log is not already in that section. p should end at a line end; a newline is
// added when it does not.
//
// When the main output is in the middle of a line that it wrote to less than a second ago,
// WriteSection writes nothing and returns false (unless force), so that the caller can try
// again once the line is likely complete instead of breaking it.
func (s *Stream) WriteSection(heading string, p []byte, force bool) (bool, error) {
	if len(p) == 0 {
		return true, nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if !s.lineStart && !force && s.conf.Now().Sub(s.lastMainWrite) < sectionHoldoff {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(); err != nil {
		return false, err
	}
	if err := s.enterSectionLocked(heading); err != nil {
		return false, err
	}
	var err error
	if s.sections != nil {
		w := s.sections[heading]
		if w == nil {
			w = s.conf.Redactor.NewWriter(lockedText{s})
			s.sections[heading] = w
		}
		_, err = w.Write(p)
	} else {
		err = s.textLocked(p)
	}
	if err == nil && !s.lineStart {
		err = s.textLocked([]byte{'\n'})
	}
	return err == nil, err
}

// enterSectionLocked starts a line in the section under heading, writing the heading when
// the log is not in that section already. Call with wmu and mu held.
func (s *Stream) enterSectionLocked(heading string) error {
	if !s.lineStart {
		if err := s.textLocked([]byte{'\n'}); err != nil {
			return err
		}
	}
	if s.section != heading {
		if err := s.textLocked([]byte(heading + "\n")); err != nil {
			return err
		}
		s.section = heading
	}
	return nil
}

// flushAllLocked writes what redaction holds back, of the main output and of each section,
// once nothing more will be written. Call with wmu and mu held.
func (s *Stream) flushAllLocked() error {
	if err := s.flushMainLocked(); err != nil {
		return err
	}
	headings := make([]string, 0, len(s.sections))
	for h, w := range s.sections {
		if w.Held() > 0 {
			headings = append(headings, h)
		}
	}
	slices.Sort(headings)
	for _, h := range headings {
		if err := s.enterSectionLocked(h); err != nil {
			return err
		}
		if err := s.sections[h].Flush(); err != nil {
			return err
		}
		if !s.lineStart {
			if err := s.textLocked([]byte{'\n'}); err != nil {
				return err
			}
		}
	}
	return nil
}

// textLocked adds p with a timestamp at the start of each line. The timestamp of a line is the
// time its first byte arrived, as in the agent: the lines of p arrived together, so the clock
// is read once for all of them (read per line, it was 40 % of the stream's CPU, redaction
// included). Call with wmu and mu held.
func (s *Stream) textLocked(p []byte) error {
	ms := int64(-1)
	for len(p) > 0 {
		if s.lineStart {
			if ms < 0 {
				ms = s.conf.Now().UnixMilli()
			}
			if err := s.putLocked(s.timestamp(ms), true); err != nil {
				return err
			}
			s.lineStart = false
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return s.putLocked(p, false)
		}
		if err := s.putLocked(p[:i+1], false); err != nil {
			return err
		}
		p = p[i+1:]
		s.lineStart = true
	}
	return nil
}

// timestamp returns Buildkite's inline timestamp for ms, ESC _ bk;t=<unix millis> BEL. Call
// with wmu held.
func (s *Stream) timestamp(ms int64) []byte {
	if ms != s.tsMillis || s.tsPrefix == nil {
		s.tsMillis = ms
		s.tsPrefix = append(append(append(s.tsPrefix[:0], "\x1b_bk;t="...), strconv.FormatInt(ms, 10)...), '\a')
	}
	return s.tsPrefix
}

// putLocked appends p to the chunk being filled, cutting chunks as they fill up. An atomic p
// (an escape sequence) is kept whole in one chunk when it fits in one. Call with mu held.
func (s *Stream) putLocked(p []byte, atomic bool) error {
	if s.aborted {
		return ErrClosed
	}
	s.written += uint64(len(p))
	max := s.conf.MaxChunkBytes
	if atomic && len(p) <= max && len(s.cur) > 0 && len(s.cur)+len(p) > max {
		if err := s.cutLocked(); err != nil {
			return err
		}
	}
	for len(p) > 0 {
		if s.cur == nil {
			s.cur = s.bufferLocked()
		}
		n := min(max-len(s.cur), len(p))
		s.cur = append(s.cur, p[:n]...)
		p = p[n:]
		if len(s.cur) == max {
			if err := s.cutLocked(); err != nil {
				return err
			}
		}
	}
	return nil
}

// cutLocked queues the chunk being filled, first waiting for room in the queue: this wait is
// the backpressure that keeps memory bounded. Call with mu held.
func (s *Stream) cutLocked() error {
	for len(s.queue) >= s.conf.QueuedChunks && !s.aborted && !s.noWait {
		s.cond.Wait()
	}
	if s.aborted {
		return ErrClosed
	}
	s.queue = append(s.queue, s.cur)
	s.cur = nil
	s.cond.Broadcast()
	return nil
}

func (s *Stream) bufferLocked() []byte {
	if n := len(s.free); n > 0 {
		b := s.free[n-1]
		s.free = s.free[:n-1]
		return b[:0]
	}
	return make([]byte, 0, s.conf.MaxChunkBytes)
}

// upload sends chunks in order, up to conf.Uploaders at once, and settles them strictly in
// order as they come back, until the stream is closed and drained.
func (s *Stream) upload() {
	defer close(s.done)
	var (
		inflight         []*flight // in sequence order
		nextSeq, nextOff = uint64(1), uint64(0)
	)
	s.mu.Lock()
	for {
		if s.aborted {
			// Chunks cut short by Abort have an unknown fate, so they are not counted.
			s.mu.Unlock()
			return
		}
		if len(inflight) > 0 && inflight[0].done {
			f := inflight[0]
			inflight = inflight[1:]
			s.stats.Sequence = f.seq
			s.stats.Offset = f.off + uint64(len(f.data))
			s.settleHolesLocked(f.off, s.stats.Offset, f.err)
			stats := s.stats
			// Kept for reuse: a full queue, the chunk being filled and those in flight
			// need no more buffers than that, and none is allocated while streaming.
			if len(s.free) < s.conf.QueuedChunks+s.conf.Uploaders+1 {
				s.free = append(s.free, f.data)
			}
			s.mu.Unlock()
			if s.conf.OnChunk != nil {
				s.conf.OnChunk(stats, f.err)
			}
			s.mu.Lock()
			continue
		}
		if len(inflight) < s.conf.Uploaders {
			if len(s.queue) == 0 && (s.tick || s.closing) {
				if s.closing && len(inflight) == 0 && s.noticeDueLocked() {
					// No writer is left to add the notice of a hole: the uploader does, and
					// sends it last.
					s.noWait = true
					_ = s.noticeLocked()
					s.noWait = false
				}
				// The interval has passed, or the stream is closing: send what is pending
				// even though it does not fill a chunk.
				if len(s.cur) > 0 {
					s.queue = append(s.queue, s.cur)
					s.cur = nil
				}
				s.tick = false
			}
			if len(s.queue) > 0 {
				f := &flight{seq: nextSeq, off: nextOff, data: s.queue[0]}
				s.queue = s.queue[1:]
				nextSeq, nextOff = nextSeq+1, nextOff+uint64(len(f.data))
				inflight = append(inflight, f)
				s.cond.Broadcast() // room in the queue
				go s.send(f)
				continue
			}
			if s.closing && len(inflight) == 0 {
				s.mu.Unlock()
				return
			}
		}
		s.cond.Wait()
	}
}

// flight is a chunk on its way to Buildkite.
type flight struct {
	seq, off uint64
	data     []byte
	done     bool  // (mu)
	err      error // (mu)
}

// send uploads one chunk and reports back to the uploader.
func (s *Stream) send(f *flight) {
	err := s.conf.Upload(s.ctx, f.seq, f.off, f.data)
	s.mu.Lock()
	f.done, f.err = true, err
	s.cond.Broadcast()
	s.mu.Unlock()
}

// ticker asks the uploader to send pending output every interval.
func (s *Stream) ticker() {
	t := time.NewTicker(s.conf.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			s.mu.Lock()
			s.tick = true
			s.cond.Broadcast()
			s.mu.Unlock()
			s.noticeWhenQuiet()
		}
	}
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
