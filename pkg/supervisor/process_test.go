package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// slowWriter collects what it is given, taking delay over each write, as the log stream
// does when Buildkite is slow (backpressure).
type slowWriter struct {
	delay time.Duration
	testkit.SyncBuffer
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(w.delay)
	return w.SyncBuffer.Write(p)
}

// TestOutputAfterExitIsBounded runs processes in-process with a short outputAfterExit: the
// reader gives up on output that processes left behind keep open, chatty or silent, once
// the bound has passed since the exit; it never cuts what the process wrote before it exited,
// however slowly the log takes it.
func TestOutputAfterExitIsBounded(t *testing.T) {
	const bound = 500 * time.Millisecond
	saved := outputAfterExit
	outputAfterExit = bound
	t.Cleanup(func() { outputAfterExit = saved })

	tests := []struct {
		name    string
		command string
		delay   time.Duration // of each write to the log
		// wantCut: the reader stopped at the bound; wantLong: it took at least the bound.
		wantCut, wantLong bool
		wantOut           []string
	}{
		{
			name:    "a process that exits and leaves nothing behind",
			command: `echo only output`,
			wantOut: []string{"only output\n"},
		},
		{
			name:     "a chatty background process holds the output open",
			command:  `(while true; do echo tick; sleep 0.05; done) & echo main done`,
			wantCut:  true,
			wantLong: true,
			wantOut:  []string{"main done\n", "tick\n"},
		},
		{
			name:     "a silent background process holds the output open",
			command:  `sleep 30 & echo main done`,
			wantCut:  true,
			wantLong: true,
			wantOut:  []string{"main done\n"},
		},
		{
			// The first write takes longer than the bound, and the rest of the output waits
			// in the pipe: waiting for the log does not count, and nothing is lost.
			name:    "output written before the exit, behind a slow log",
			command: `for i in 1 2 3 4 5; do echo "line $i"; sleep 0.02; done`,
			delay:   3 * bound,
			wantOut: []string{"line 1\n", "line 5\n"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &slowWriter{delay: tt.delay}
			p, err := startProcess("/bin/sh", []string{"-c", tt.command}, t.TempDir(), os.Environ(), out)
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.signal(syscall.SIGKILL) })
			<-p.exited
			exited := time.Now()
			done := make(chan struct{})
			go func() { p.wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(bound + 10*time.Second):
				t.Fatalf("the output was still being read %s after the process exited; so far:\n%s", time.Since(exited), out.String())
			}
			took := time.Since(exited)
			assert.Equal(t, tt.wantCut, p.cutOff.Load(), "cut off (after %s)", took)
			if tt.wantLong {
				assert.GreaterOrEqual(t, took, bound, "the reader gave up before the bound")
			}
			for _, want := range tt.wantOut {
				assert.Contains(t, out.String(), want)
			}
			assert.True(t, p.succeeded())
		})
	}
}

// TestAwaitGroup: once a job is told to stop, the supervisor waits for what is left of the
// command's process group only as long as something of it runs, and at most until the
// SIGKILL at the end of the grace period.
func TestAwaitGroup(t *testing.T) {
	tests := []struct {
		name string
		// background is started in the command's group, its output elsewhere; it writes
		// its pid to $1.
		background string
		// kill is when the test closes killed, as the SIGKILL timer would.
		kill     time.Duration
		atLeast  time.Duration
		atMost   time.Duration
		wantGone bool
	}{
		{
			name:       "a background process that exits a second after SIGTERM",
			background: `trap 'sleep 1; exit 0' TERM; echo $$ > "$1"; while :; do sleep 0.05; done`,
			kill:       20 * time.Second,
			atLeast:    500 * time.Millisecond,
			atMost:     5 * time.Second,
			wantGone:   true,
		},
		{
			name:       "a background process that ignores SIGTERM waits for the SIGKILL",
			background: `trap '' TERM; echo $$ > "$1"; while :; do sleep 0.05; done`,
			kill:       time.Second,
			atLeast:    time.Second,
			atMost:     5 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			pidfile, script := filepath.Join(dir, "pid"), filepath.Join(dir, "background.sh")
			require.NoError(t, os.WriteFile(script, []byte(tt.background), 0o644))
			command := fmt.Sprintf(`sh %s %s >/dev/null 2>&1 & while [ ! -s %s ]; do sleep 0.01; done; exit 0`, script, pidfile, pidfile)
			p, err := startProcess("/bin/sh", []string{"-c", command}, t.TempDir(), os.Environ(), &slowWriter{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.signal(syscall.SIGKILL) })
			p.wait()
			b, err := os.ReadFile(pidfile)
			require.NoError(t, err)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			require.NoError(t, err)

			require.NoError(t, p.signal(syscall.SIGTERM))
			killed := make(chan struct{})
			timer := time.AfterFunc(tt.kill, func() { _ = p.signal(syscall.SIGKILL); close(killed) })
			defer timer.Stop()
			start := time.Now()
			p.awaitGroup(killed)
			took := time.Since(start)
			assert.GreaterOrEqual(t, took, tt.atLeast)
			assert.LessOrEqual(t, took, tt.atMost)
			if tt.wantGone {
				assert.True(t, gone(pid), "awaitGroup returned while the background process %d ran", pid)
			}
		})
	}
}

// TestGrowPipe checks that the output pipe is given the size asked for, within what the
// kernel allows, and that growing is only a saving: a pipe the kernel will not grow keeps
// working.
func TestGrowPipe(t *testing.T) {
	maxSize, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	require.NoError(t, err)
	limit, err := strconv.Atoi(strings.TrimSpace(string(maxSize)))
	require.NoError(t, err)
	tests := []struct {
		name string
		size int
		want int
	}{
		{name: "the supervisor's size", size: outputPipeBytes, want: outputPipeBytes},
		{name: "a size between pages rounds up", size: 100 << 10, want: 128 << 10},
		{name: "the default", size: 64 << 10, want: 64 << 10},
		// Below one page, Linux gives one page.
		{name: "tiny", size: 1, want: os.Getpagesize()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want > limit {
				t.Skipf("pipe-max-size is %d, under %d", limit, tt.want)
			}
			r, w, err := os.Pipe()
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
			assert.Equal(t, tt.want, growPipe(r, tt.size))
			// Still non-blocking, read through the poller: a deadline works.
			require.NoError(t, r.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
			_, err = r.Read(make([]byte, 1))
			assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
		})
	}
	t.Run("refused: the pipe keeps working", func(t *testing.T) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
		assert.Equal(t, 0, growPipe(r, -1))
		_, err = w.Write([]byte("still there"))
		require.NoError(t, err)
		buf := make([]byte, 64)
		n, err := r.Read(buf)
		require.NoError(t, err)
		assert.Equal(t, "still there", string(buf[:n]))
	})
}

// TestOutputCopiedWhole runs commands printing more than the pipe and the read buffer
// hold, at once and in small writes, and checks that every byte reaches the log in order.
func TestOutputCopiedWhole(t *testing.T) {
	dir := t.TempDir()
	big := make([]byte, 3*outputPipeBytes+12345)
	for i := range big {
		big[i] = byte('a' + i%23)
		if i%97 == 96 {
			big[i] = '\n'
		}
	}
	file := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(file, big, 0o644))
	tests := []struct {
		name    string
		command string
		want    []byte
	}{
		{name: "one large file", command: "cat " + file, want: big},
		{name: "many small writes", command: `i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); done`, want: func() []byte {
			var b strings.Builder
			for i := range 3000 {
				fmt.Fprintf(&b, "line %d\n", i)
			}
			return []byte(b.String())
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &slowWriter{delay: time.Millisecond}
			p, err := startProcess("sh", []string{"-c", tt.command}, dir, os.Environ(), out)
			require.NoError(t, err)
			ws := p.wait()
			require.True(t, ws.Exited() && ws.ExitStatus() == 0, "exit %v", ws)
			assert.Equal(t, string(tt.want), out.String())
		})
	}
}
