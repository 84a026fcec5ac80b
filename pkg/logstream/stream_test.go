package logstream

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sent is one chunk as the upload function saw it.
type sent struct {
	seq, off uint64
	data     []byte
	at       time.Time
}

// recorder is an upload function that keeps what it is given, optionally failing or blocking.
type recorder struct {
	mu     sync.Mutex
	chunks []sent
	fail   func(seq uint64) error
	gate   chan struct{} // when set, each upload waits for a value
}

func (r *recorder) upload(ctx context.Context, seq, off uint64, data []byte) error {
	if r.gate != nil {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunks = append(r.chunks, sent{seq: seq, off: off, data: bytes.Clone(data), at: time.Now()})
	if r.fail != nil {
		return r.fail(seq)
	}
	return nil
}

// all returns the chunks in sequence order, as Buildkite puts together chunks that several
// uploaders sent.
func (r *recorder) all() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]sent(nil), r.chunks...)
	slices.SortStableFunc(out, func(a, b sent) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

func (r *recorder) joined() []byte {
	var b []byte
	for _, c := range r.all() {
		b = append(b, c.data...)
	}
	return b
}

// fixedClock returns a clock that reads ms milliseconds after the epoch.
func fixedClock(ms int64) func() time.Time {
	return func() time.Time { return time.UnixMilli(ms) }
}

func ts(ms int64) string { return "\x1b_bk;t=" + strconv.FormatInt(ms, 10) + "\a" }

func TestTimestampsAndChunks(t *testing.T) {
	const ms = 1700000000123
	T := ts(ms)
	tests := []struct {
		name     string
		max      int
		writes   []string
		want     string   // the whole log
		wantCuts []string // each chunk, when the cut points matter
	}{
		{
			name:   "one line per write",
			max:    1 << 20,
			writes: []string{"hello\n", "world\n"},
			want:   T + "hello\n" + T + "world\n",
		},
		{
			name:   "lines split across writes get one timestamp",
			max:    1 << 20,
			writes: []string{"hel", "lo\nwor", "ld\n"},
			want:   T + "hello\n" + T + "world\n",
		},
		{
			name:   "no trailing newline",
			max:    1 << 20,
			writes: []string{"a\nb"},
			want:   T + "a\n" + T + "b",
		},
		{
			name:   "empty lines are stamped too",
			max:    1 << 20,
			writes: []string{"\n\n"},
			want:   T + "\n" + T + "\n",
		},
		{
			name:     "size cuts never exceed the maximum",
			max:      len(T) + 4,
			writes:   []string{"abcdefghij\n"},
			want:     T + "abcdefghij\n",
			wantCuts: []string{T + "abcd", "efghij\n"},
		},
		{
			name: "a timestamp that does not fit moves to the next chunk whole",
			max:  len(T) + 6,
			// The first chunk holds T+"ab\n" (len(T)+3); the second line's timestamp would
			// overflow it, so the chunk is cut short instead of splitting the escape sequence.
			writes:   []string{"ab\ncd\n"},
			want:     T + "ab\n" + T + "cd\n",
			wantCuts: []string{T + "ab\n", T + "cd\n"},
		},
		{
			name:     "a line that starts exactly at a chunk boundary is stamped in the next chunk",
			max:      len(T) + 3,
			writes:   []string{"ab\n", "cd\n"},
			want:     T + "ab\n" + T + "cd\n",
			wantCuts: []string{T + "ab\n", T + "cd\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			s, err := New(Config{MaxChunkBytes: tt.max, Interval: time.Hour, Upload: rec.upload, Now: fixedClock(ms)})
			require.NoError(t, err)
			for _, w := range tt.writes {
				n, err := s.Write([]byte(w))
				require.NoError(t, err)
				require.Equal(t, len(w), n)
			}
			stats, err := s.Close(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(rec.joined()))
			chunks := rec.all()
			var off uint64
			for i, c := range chunks {
				assert.Equal(t, uint64(i+1), c.seq, "sequence counts from 1")
				assert.Equal(t, off, c.off, "offset is the uncompressed bytes before the chunk")
				assert.LessOrEqual(t, len(c.data), tt.max)
				off += uint64(len(c.data))
			}
			if tt.wantCuts != nil {
				var got []string
				for _, c := range chunks {
					got = append(got, string(c.data))
				}
				assert.Equal(t, tt.wantCuts, got)
			}
			assert.Equal(t, Stats{Sequence: uint64(len(chunks)), Offset: off}, stats)
		})
	}
}

func TestTimestampIsWhenTheLineStarts(t *testing.T) {
	now := int64(1000)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.UnixMilli(now) }
	advance := func() { mu.Lock(); now += 1000; mu.Unlock() }
	rec := &recorder{}
	s, err := New(Config{MaxChunkBytes: 1 << 20, Interval: time.Hour, Upload: rec.upload, Now: clock})
	require.NoError(t, err)
	_, _ = s.Write([]byte("first "))
	advance()
	_, _ = s.Write([]byte("line\n")) // the next line has not started: no timestamp yet
	advance()
	_, _ = s.Write([]byte("second\n"))
	_, err = s.Close(context.Background())
	require.NoError(t, err)
	assert.Equal(t, ts(1000)+"first line\n"+ts(3000)+"second\n", string(rec.joined()))
}

func TestIntervalFlush(t *testing.T) {
	rec := &recorder{}
	s, err := New(Config{MaxChunkBytes: 1 << 20, Interval: 50 * time.Millisecond, Upload: rec.upload})
	require.NoError(t, err)
	start := time.Now()
	_, err = s.Write([]byte("partial line, no newline"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(rec.all()) == 1 }, 2*time.Second, 5*time.Millisecond,
		"pending output is sent after the interval without waiting for the chunk to fill up")
	c := rec.all()[0]
	assert.GreaterOrEqual(t, c.at.Sub(start), 40*time.Millisecond, "not before the interval")
	assert.Contains(t, string(c.data), "partial line, no newline")

	_, err = s.Write([]byte(" continued\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(rec.all()) == 2 }, 2*time.Second, 5*time.Millisecond)
	c2 := rec.all()[1]
	assert.Equal(t, " continued\n", string(c2.data), "a line continued in the next chunk gets no new timestamp")
	assert.Equal(t, uint64(2), c2.seq)
	assert.Equal(t, uint64(len(c.data)), c2.off)
	_, err = s.Close(context.Background())
	require.NoError(t, err)
	assert.Len(t, rec.all(), 2, "closing with nothing pending sends nothing")
}

func TestFailedChunksAreCountedAndSkipped(t *testing.T) {
	refused := errors.New("422 Unprocessable Entity")
	rec := &recorder{fail: func(seq uint64) error {
		if seq == 2 {
			return refused
		}
		return nil
	}}
	var mu sync.Mutex
	var seen []Stats
	var errs []error
	s, err := New(Config{MaxChunkBytes: 4, Interval: time.Hour, Upload: rec.upload, Now: fixedClock(1),
		OnChunk: func(st Stats, err error) { mu.Lock(); seen = append(seen, st); errs = append(errs, err); mu.Unlock() }})
	require.NoError(t, err)
	// Timestamps are 8 bytes ("\x1b_bk;t=1\a" is 10) so chunks cut inside them; that is fine,
	// this test is about accounting.
	_, err = s.Write([]byte("aaaa"))
	require.NoError(t, err)
	stats, err := s.Close(context.Background())
	require.NoError(t, err)
	// Every chunk sent, the refused one and the notice of the hole after it included.
	total := uint64(len(rec.joined()))
	assert.Greater(t, total, uint64(len(ts(1))+4))
	assert.Equal(t, total, stats.Offset, "a refused chunk's bytes still move the offset: the next chunk must not overlap it")
	assert.Equal(t, 1, stats.FailedChunks)
	assert.Equal(t, uint64(4), stats.LostBytes)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, int(stats.Sequence))
	for i, st := range seen {
		assert.Equal(t, uint64(i+1), st.Sequence)
	}
	assert.ErrorIs(t, errs[1], refused)
	assert.Equal(t, 1, seen[1].FailedChunks)
	assert.Equal(t, 0, seen[0].FailedChunks)
}

func TestBackpressureBoundsMemory(t *testing.T) {
	gate := make(chan struct{})
	rec := &recorder{gate: gate}
	const max = 1024
	s, err := New(Config{MaxChunkBytes: max, Interval: time.Hour, Upload: rec.upload, QueuedChunks: 2})
	require.NoError(t, err)
	wrote := make(chan int, 1)
	go func() {
		// 100 chunks' worth: far more than the queue holds.
		n, _ := s.Write(bytes.Repeat([]byte("x"), 100*max))
		wrote <- n
	}()
	// One chunk in flight, two queued, one filling: the writer must now be blocked.
	time.Sleep(200 * time.Millisecond)
	select {
	case <-wrote:
		t.Fatal("Write returned while the uploader was stuck: output is being buffered without limit")
	default:
	}
	s.mu.Lock()
	queued, cur := len(s.queue), len(s.cur)
	s.mu.Unlock()
	assert.LessOrEqual(t, queued, 2)
	assert.LessOrEqual(t, cur, max)
	close(gate) // let every upload through
	select {
	case n := <-wrote:
		assert.Equal(t, 100*max, n)
	case <-time.After(10 * time.Second):
		t.Fatal("Write stayed blocked after the uploader caught up")
	}
	stats, err := s.Close(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uint64(len(rec.joined())), stats.Offset)
	assert.Equal(t, string(bytes.Repeat([]byte("x"), 100*max)), stripTimestamps(t, rec.joined()), "every byte, in order, one timestamp for the one line")
}

func TestCloseWithDeadlineAborts(t *testing.T) {
	rec := &recorder{gate: make(chan struct{})} // never opens: Buildkite is unreachable
	s, err := New(Config{MaxChunkBytes: 8, Interval: time.Hour, Upload: rec.upload, QueuedChunks: 1})
	require.NoError(t, err)
	go func() { _, _ = s.Write(bytes.Repeat([]byte("y"), 1000)) }()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	stats, err := s.Close(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, Stats{}, stats, "nothing was acknowledged")
	_, err = s.Write([]byte("late"))
	assert.ErrorIs(t, err, ErrClosed)
}

func TestSections(t *testing.T) {
	now := time.UnixMilli(5000)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	rec := &recorder{}
	s, err := New(Config{MaxChunkBytes: 1 << 20, Interval: time.Hour, Upload: rec.upload, Now: clock,
		ResumeHeading: "~~~ resumed"})
	require.NoError(t, err)
	T := ts(5000)

	_, _ = s.Write([]byte("cmd line\n"))
	ok, err := s.WriteSection("--- file", []byte("f1\nf2\n"), false)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = s.WriteSection("--- file", []byte("f3"), false)
	require.NoError(t, err)
	assert.True(t, ok, "same section again: no second heading; a newline ends the partial line")
	_, _ = s.Write([]byte("cmd mid-"))
	ok, err = s.WriteSection("--- other", []byte("o1\n"), false)
	require.NoError(t, err)
	assert.False(t, ok, "the command is in the middle of a line it just wrote: wait")
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	ok, err = s.WriteSection("--- other", []byte("o1\n"), false)
	require.NoError(t, err)
	assert.True(t, ok, "the line has been left unfinished long enough: break it")
	require.NoError(t, s.WriteLine("# notice"))
	_, err = s.Close(context.Background())
	require.NoError(t, err)
	T2 := ts(7000)
	want := T + "cmd line\n" + T + "--- file\n" + T + "f1\n" + T + "f2\n" + T + "f3\n" +
		T + "~~~ resumed\n" + T + "cmd mid-\n" + T2 + "--- other\n" + T2 + "o1\n" + T2 + "# notice\n"
	assert.Equal(t, want, string(rec.joined()))
}

func TestTailFiles(t *testing.T) {
	dir := t.TempDir()
	early := filepath.Join(dir, "early.log")
	late := filepath.Join(dir, "late.log")
	require.NoError(t, os.WriteFile(early, []byte("e1\ne2 partial"), 0o644))

	rec := &recorder{}
	s, err := New(Config{MaxChunkBytes: 1 << 20, Interval: 20 * time.Millisecond, Upload: rec.upload})
	require.NoError(t, err)
	tl := TailFiles(s, []string{early, late}, 20*time.Millisecond, t.Logf)

	plain := func() string { return stripTimestamps(t, rec.joined()) }
	require.Eventually(t, func() bool { return bytes.Contains([]byte(plain()), []byte("e1\n")) }, 5*time.Second, 10*time.Millisecond)
	assert.NotContains(t, plain(), "partial", "a line still being written is held back")

	require.NoError(t, os.WriteFile(late, []byte("l1\n"), 0o644)) // appears later
	require.Eventually(t, func() bool { return bytes.Contains([]byte(plain()), []byte("l1\n")) }, 5*time.Second, 10*time.Millisecond)

	f, err := os.OpenFile(early, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(" done\ne3 no newline at the end")
	require.NoError(t, err)
	require.NoError(t, f.Close())

	tl.Stop()
	_, err = s.Close(context.Background())
	require.NoError(t, err)
	got := plain()
	early1 := FileHeading(early) + "\ne1\n"
	assert.Contains(t, got, early1)
	assert.Contains(t, got, FileHeading(late)+"\nl1\n")
	assert.Contains(t, got, "e2 partial done\ne3 no newline at the end\n", "what is left is flushed at the end, with a newline")
	assert.Equal(t, 1, bytes.Count([]byte(got), []byte("e1")), "nothing is sent twice")
}

var tsRE = regexp.MustCompile(`^\x1b_bk;t=[0-9]+\x07`)

// stripTimestamps removes the timestamp at the start of every line, failing when a line has
// none: the log must have exactly one, at the line start.
func stripTimestamps(t testing.TB, log []byte) string {
	t.Helper()
	var out bytes.Buffer
	for len(log) > 0 {
		loc := tsRE.FindIndex(log)
		if loc == nil {
			t.Fatalf("line without a timestamp at its start: %q", truncate(log))
		}
		log = log[loc[1]:]
		i := bytes.IndexByte(log, '\n')
		if i < 0 {
			out.Write(log)
			break
		}
		out.Write(log[:i+1])
		log = log[i+1:]
	}
	return out.String()
}

func truncate(b []byte) string {
	if len(b) > 80 {
		return fmt.Sprintf("%s...", b[:80])
	}
	return string(b)
}

// TestUploadersSettleInOrder: with several uploaders, chunks travel at once, but they are
// settled in sequence order: a chunk acknowledged before the one ahead of it does not move
// the stats, which always say how far the log got with nothing missing before.
func TestUploadersSettleInOrder(t *testing.T) {
	release := map[uint64]chan struct{}{1: make(chan struct{}), 2: make(chan struct{}), 3: make(chan struct{})}
	var mu sync.Mutex
	var inFlight, most int
	var settled []uint64
	upload := func(ctx context.Context, seq, off uint64, data []byte) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		if ch, ok := release[seq]; ok {
			<-ch
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	}
	s, err := New(Config{MaxChunkBytes: 32, Interval: time.Hour, Upload: upload, Uploaders: 3, Now: fixedClock(1),
		OnChunk: func(st Stats, err error) { mu.Lock(); settled = append(settled, st.Sequence); mu.Unlock() }})
	require.NoError(t, err)
	wrote := make(chan error, 1)
	go func() {
		// More than three chunks: the writer waits for room while the three are held.
		_, err := s.Write(bytes.Repeat([]byte("0123456789\n"), 20))
		wrote <- err
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return inFlight == 3 }, 5*time.Second, time.Millisecond,
		"three chunks on their way at once")

	close(release[3])
	close(release[2])
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, s.Stats().Sequence, "chunks 2 and 3 are acknowledged, but chunk 1 is not: nothing is settled")
	close(release[1])
	require.NoError(t, <-wrote)
	stats, err := s.Close(context.Background())
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 3, most, "never more than three in flight")
	require.Len(t, settled, int(stats.Sequence))
	for i, seq := range settled {
		assert.Equal(t, uint64(i+1), seq, "settled in order")
	}
}
