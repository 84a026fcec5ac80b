package logstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"time"
)

// FileHeading is the section heading under which a log file's content appears.
func FileHeading(path string) string { return "--- :page_facing_up: " + path }

// tailReadMax bounds one read of a log file, and so the memory a tailer holds.
const tailReadMax = 256 << 10

// Tailer streams files into a Stream as they grow, each under its own heading. Files that do
// not exist yet are waited for; a file that shrinks (truncated or replaced) is read again from
// its start.
type Tailer struct {
	stream *Stream
	files  []*tailedFile
	every  time.Duration
	logf   func(format string, args ...any)

	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex // one poll at a time
}

type tailedFile struct {
	path    string
	heading string
	off     int64
	warned  bool
}

// TailFiles starts tailing paths into s, looking for new content every interval. logf, when
// set, is told about files that cannot be read.
func TailFiles(s *Stream, paths []string, every time.Duration, logf func(format string, args ...any)) *Tailer {
	if every <= 0 {
		every = time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &Tailer{stream: s, every: every, logf: logf, cancel: cancel, done: make(chan struct{})}
	for _, p := range paths {
		t.files = append(t.files, &tailedFile{path: p, heading: FileHeading(p)})
	}
	go t.run(ctx)
	return t
}

func (t *Tailer) run(ctx context.Context) {
	defer close(t.done)
	tick := time.NewTicker(t.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.pollAll(false)
		}
	}
}

// Stop stops tailing and writes what is left of every file, the last line even when it has
// no newline yet. Call it once the command has ended and before the stream is closed.
func (t *Tailer) Stop() {
	t.cancel()
	<-t.done
	t.pollAll(true)
}

func (t *Tailer) pollAll(final bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.files {
		if err := f.poll(t.stream, final); err != nil && !errors.Is(err, ErrClosed) {
			if !f.warned && t.logf != nil {
				t.logf("log_paths: %v", err)
			}
			f.warned = true
		}
	}
}

// poll writes the file's new complete lines (all its new bytes when final). A line still being
// written is left for the next poll, unless it alone fills a read.
func (f *tailedFile) poll(s *Stream, final bool) error {
	file, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", f.path, err)
	}
	defer func() { _ = file.Close() }()
	info, err := file.Stat()
	if err != nil {
		return fmt.Errorf("reading %s: %w", f.path, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("reading %s: not a regular file", f.path)
	}
	if info.Size() < f.off {
		f.off = 0
	}
	buf := make([]byte, tailReadMax)
	for {
		n, err := file.ReadAt(buf, f.off)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading %s: %w", f.path, err)
		}
		data := buf[:n]
		if n == 0 {
			return nil
		}
		if !final && n < len(buf) {
			// Hold back the line still being written.
			i := bytes.LastIndexByte(data, '\n')
			if i < 0 {
				return nil
			}
			data = data[:i+1]
		}
		ok, werr := s.WriteSection(f.heading, data, final)
		if werr != nil {
			return werr
		}
		if !ok {
			return nil // the main output is mid-line; try again next poll
		}
		f.off += int64(len(data))
		if n < len(buf) && len(data) == n {
			return nil
		}
	}
}
