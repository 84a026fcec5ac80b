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
// not exist yet are waited for. A file that is rotated (renamed or deleted, and created
// again) is read to its end and then followed at its path from the new file's start; one
// truncated or rewritten in place (copytruncate) is read again from its start.
type Tailer struct {
	stream *Stream
	files  []*tailedFile
	every  time.Duration
	logf   func(format string, args ...any)

	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex // one poll at a time; guards buf
	buf    []byte
}

// fingerprintLen is how many of the last bytes read are kept to notice a file rewritten in
// place: truncated and written again past the offset read, between two polls.
const fingerprintLen = 64

type tailedFile struct {
	path    string
	heading string
	// file is the file being read, kept open so that a rotated file can still be read to
	// its end; info is its identity when opened.
	file *os.File
	info fs.FileInfo
	off  int64
	// last holds the last bytes read, before off, to notice a rewrite.
	last   []byte
	warned bool
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
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.files {
		f.close()
	}
}

func (t *Tailer) pollAll(final bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.buf == nil {
		t.buf = make([]byte, tailReadMax)
	}
	for _, f := range t.files {
		if err := f.poll(t.stream, t.buf, final); err != nil && !errors.Is(err, ErrClosed) {
			if !f.warned && t.logf != nil {
				t.logf("log_paths: %v", err)
			}
			f.warned = true
		}
	}
}

// poll writes the file's new complete lines (all its new bytes when final), following a
// rotation. A line still being written is left for the next poll, unless it alone fills a
// read.
func (f *tailedFile) poll(s *Stream, buf []byte, final bool) error {
	info, err := os.Stat(f.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		info = nil
	case err != nil:
		return fmt.Errorf("reading %s: %w", f.path, err)
	}
	if f.file != nil && (info == nil || !os.SameFile(info, f.info)) {
		// Rotated away: what was written to the old file before the rename is read to its
		// end, even a last line without a newline, before the new file is followed.
		done, err := f.copyNew(s, buf, true, final)
		if err != nil || !done {
			return err // the main output is mid-line; the next poll finishes
		}
		f.close()
	}
	if info == nil {
		return nil
	}
	if f.file == nil {
		if err := f.open(); err != nil {
			return err
		}
	}
	_, err = f.copyNew(s, buf, final, final)
	return err
}

func (f *tailedFile) open() error {
	file, err := os.Open(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // gone again between the stat and the open; the next poll sees
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", f.path, err)
	}
	info, err := file.Stat()
	if err != nil {
		_ = file.Close()
		return fmt.Errorf("reading %s: %w", f.path, err)
	}
	if !info.Mode().IsRegular() {
		_ = file.Close()
		return fmt.Errorf("reading %s: not a regular file", f.path)
	}
	f.file, f.info, f.off, f.last = file, info, 0, f.last[:0]
	return nil
}

func (f *tailedFile) close() {
	if f.file != nil {
		_ = f.file.Close()
	}
	f.file, f.info = nil, nil
}

// copyNew writes what the open file has past the offset: whole lines only unless all, and
// breaking a line of the main output only when force. done is false when the stream asked
// to wait for the main output to finish its line.
func (f *tailedFile) copyNew(s *Stream, buf []byte, all, force bool) (done bool, err error) {
	if f.file == nil {
		return true, nil
	}
	info, err := f.file.Stat()
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", f.path, err)
	}
	if info.Size() < f.off || !f.unchanged() {
		// Truncated, or truncated and written again: read it again from its start.
		f.off, f.last = 0, f.last[:0]
	}
	for {
		n, err := f.file.ReadAt(buf, f.off)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, fmt.Errorf("reading %s: %w", f.path, err)
		}
		data := buf[:n]
		if n == 0 {
			return true, nil
		}
		if !all && n < len(buf) {
			// Hold back the line still being written.
			i := bytes.LastIndexByte(data, '\n')
			if i < 0 {
				return true, nil
			}
			data = data[:i+1]
		}
		ok, werr := s.WriteSection(f.heading, data, force)
		if werr != nil {
			return false, werr
		}
		if !ok {
			return false, nil
		}
		f.off += int64(len(data))
		f.last = append(f.last[:0], data[max(len(data)-fingerprintLen, 0):]...)
		if n < len(buf) && len(data) == n {
			return true, nil
		}
	}
}

// unchanged reports that the bytes last read are still where they were: the file was not
// rewritten under the offset.
func (f *tailedFile) unchanged() bool {
	if len(f.last) == 0 {
		return true
	}
	got := make([]byte, len(f.last))
	n, err := f.file.ReadAt(got, f.off-int64(len(f.last)))
	return n == len(got) && (err == nil || errors.Is(err, io.EOF)) && bytes.Equal(got, f.last)
}
