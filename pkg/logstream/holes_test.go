package logstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// delivered is the log as Buildkite keeps it: the chunks it acknowledged, in order.
func (r *recorder) delivered(failed func(seq uint64) bool) []byte {
	var b []byte
	for _, c := range r.all() {
		if !failed(c.seq) {
			b = append(b, c.data...)
		}
	}
	return b
}

var anyTimestampRE = regexp.MustCompile("\x1b_bk;t=[0-9]+\a")

var noticeRE = regexp.MustCompile(`(\d+) bytes of this log are missing .*bytes (\d+) to (\d+) `)

// TestRefusedChunkLeavesANotice: a chunk Buildkite refuses is a hole in the log, and the log
// says so on a line of its own after the hole: how many bytes, and which.
func TestRefusedChunkLeavesANotice(t *testing.T) {
	refused := errors.New("422 Unprocessable Entity: chunk refused")
	tests := []struct {
		name string
		// refuse says which sequence numbers Buildkite refuses.
		refuse func(seq uint64) bool
		// lines written, then the stream is closed.
		lines int
		// wantNotices is how many notices reach the log.
		wantNotices int
		wantFailed  int
	}{
		{name: "a chunk in the middle", refuse: func(seq uint64) bool { return seq == 2 }, lines: 40, wantNotices: 1, wantFailed: 1},
		{name: "the last chunk, refused while closing", refuse: func(seq uint64) bool { return seq == 1 }, lines: 3, wantNotices: 1, wantFailed: 1},
		{name: "two holes", refuse: func(seq uint64) bool { return seq == 2 || seq == 6 }, lines: 60, wantNotices: 2, wantFailed: 2},
		{name: "everything refused: the stream still ends", refuse: func(uint64) bool { return true }, lines: 30, wantNotices: 0},
	}
	for _, tt := range tests {
		for _, uploaders := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s, %d uploaders", tt.name, uploaders), func(t *testing.T) {
				rec := &recorder{fail: func(seq uint64) error {
					if tt.refuse(seq) {
						return refused
					}
					return nil
				}}
				s, err := New(Config{MaxChunkBytes: 256, Interval: time.Hour, Upload: rec.upload, Now: fixedClock(1700000000000), Uploaders: uploaders})
				require.NoError(t, err)
				for i := range tt.lines {
					_, err := fmt.Fprintf(s, "output line %03d\n", i)
					require.NoError(t, err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				stats, err := s.Close(ctx)
				require.NoError(t, err, "closing must end even when Buildkite refuses every chunk")

				var lost uint64
				var holes [][2]uint64
				for _, c := range rec.all() {
					if tt.refuse(c.seq) {
						lost += uint64(len(c.data))
						holes = append(holes, [2]uint64{c.off, c.off + uint64(len(c.data))})
					}
				}
				if tt.wantFailed > 0 {
					assert.Equal(t, tt.wantFailed, stats.FailedChunks)
				} else {
					assert.Positive(t, stats.FailedChunks)
					assert.LessOrEqual(t, stats.FailedChunks, 40, "notices about notices must stop")
				}
				assert.Equal(t, lost, stats.LostBytes, "the progress record counts the bytes missing")

				log := rec.delivered(tt.refuse)
				if tt.wantNotices == 0 {
					return
				}
				// A hole may end in the middle of a line, so the line after it has no timestamp
				// of its own.
				plain := anyTimestampRE.ReplaceAllString(string(log), "")
				t.Logf("log as Buildkite has it:\n%s", plain)
				var notices []string
				for _, line := range strings.Split(plain, "\n") {
					// A notice cut by a later hole is partly missing itself; the notice
					// after that hole covers both. A whole one is a line of its own, with
					// its timestamp.
					if strings.HasPrefix(line, "🚨") && noticeRE.MatchString(line) &&
						regexp.MustCompile(anyTimestampRE.String()+regexp.QuoteMeta(line)).Match(log) {
						notices = append(notices, line)
					}
				}
				// Where a notice's own chunk is refused, the next notice covers both holes.
				require.NotEmpty(t, notices, "log:\n%s", plain)
				require.LessOrEqual(t, len(notices), tt.wantNotices, "log:\n%s", plain)
				for _, h := range holes {
					covered := false
					for _, n := range notices {
						m := noticeRE.FindStringSubmatch(n)
						require.NotNil(t, m, "notice %q says how many bytes, which, and why", n)
						from, _ := strconv.ParseUint(m[2], 10, 64)
						to, _ := strconv.ParseUint(m[3], 10, 64)
						if from <= h[0] && h[1] <= to {
							covered = true
							var inside uint64
							for _, o := range holes {
								if from <= o[0] && o[1] <= to {
									inside += o[1] - o[0]
								}
							}
							assert.Equal(t, strconv.FormatUint(inside, 10), m[1], "notice %q counts the bytes missing", n)
							assert.Contains(t, n, "chunk refused", "and says why")
							// After the hole: in the whole log, refused chunks included, the
							// notice comes after the hole's last byte.
							assert.GreaterOrEqual(t, bytes.Index(rec.joined(), []byte(n)), int(h[1]))
						}
					}
					assert.True(t, covered, "no notice for the hole at bytes %d to %d: %q", h[0], h[1], notices)
				}
				assert.True(t, strings.HasPrefix(plain, "output line 000\n") || tt.refuse(1))
			})
		}
	}
}
