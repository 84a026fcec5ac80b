package logstream

import (
	"fmt"
	"strconv"
	"strings"
)

// maxNoticeStreak stops notices once this many chunks in a row were refused: Buildkite is
// refusing everything (the job is over, say), and a notice about a notice would follow a
// notice for ever.
const maxNoticeStreak = 3

// maxReasonLen bounds the reason quoted in a notice.
const maxReasonLen = 300

// hole is a stretch of the log Buildkite refused, possibly several chunks with delivered
// ones in between.
type hole struct {
	from, to uint64 // the offsets of its first and past its last byte
	bytes    uint64 // how many bytes are missing in it
	chunks   int
	reason   string // why the last one was refused
}

func (h hole) empty() bool { return h.chunks == 0 }

func (h hole) merge(o hole) hole {
	if h.empty() {
		return o
	}
	if o.empty() {
		return h
	}
	reason := o.reason
	if reason == "" {
		reason = h.reason
	}
	return hole{from: min(h.from, o.from), to: max(h.to, o.to), bytes: h.bytes + o.bytes, chunks: h.chunks + o.chunks, reason: reason}
}

// settleHolesLocked accounts for the chunk [off, end) that Buildkite acknowledged (err nil)
// or refused. Call with mu held.
func (s *Stream) settleHolesLocked(off, end uint64, err error) {
	// The chunk holds part of the last notice, or its end.
	holdsNotice := !s.told.empty() && off <= s.noticeAt && s.noticeFrom < end
	if err == nil {
		s.failStreak = 0
		if holdsNotice && s.noticeAt < end {
			s.told = hole{} // delivered, its last chunk too
		}
		return
	}
	s.stats.FailedChunks++
	s.stats.LostBytes += end - off
	s.failStreak++
	lost := hole{from: off, to: end, bytes: end - off, chunks: 1, reason: err.Error()}
	if holdsNotice {
		// The notice, or part of it, went with the chunk: the next one describes its hole
		// too.
		lost = s.told.merge(lost)
		s.told = hole{}
	}
	s.untold = s.untold.merge(lost)
}

func (s *Stream) noticeDueLocked() bool {
	return !s.untold.empty() && s.failStreak < maxNoticeStreak
}

// noticeLocked writes the line that tells of the holes not told yet, on a line of its own,
// stamped like any other. Call with mu held, and with wmu held unless the stream is closing
// (then no writer is left) or noWait is set.
func (s *Stream) noticeLocked() error {
	h := s.untold
	if !s.told.empty() {
		// The last notice is not delivered yet, and may never be: this one covers its hole.
		h = s.told.merge(h)
	}
	s.untold = hole{}
	from := s.written
	if !s.lineStart {
		if err := s.putLocked([]byte{'\n'}, false); err != nil {
			return err
		}
	}
	ts := "\x1b_bk;t=" + strconv.FormatInt(s.conf.Now().UnixMilli(), 10) + "\a"
	if err := s.putLocked([]byte(ts), true); err != nil {
		return err
	}
	if err := s.putLocked([]byte(noticeText(h)+"\n"), false); err != nil {
		return err
	}
	s.lineStart = true
	s.told, s.noticeFrom, s.noticeAt = h, from, s.written-1
	return nil
}

func noticeText(h hole) string {
	reason := strings.Join(strings.Fields(h.reason), " ")
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen] + "..."
	}
	chunks := "1 chunk"
	if h.chunks > 1 {
		chunks = fmt.Sprintf("%d chunks", h.chunks)
	}
	return fmt.Sprintf("🚨 %d bytes of this log are missing above: Buildkite refused log bytes %d to %d (%s): %s",
		h.bytes, h.from, h.to, chunks, reason)
}

// noticeWhenQuiet writes a notice that is due when no writer comes to write it: the
// command is quiet. It never waits for a writer.
func (s *Stream) noticeWhenQuiet() {
	if !s.wmu.TryLock() {
		return // a writer is busy, and writes the notice itself
	}
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing && !s.aborted && s.noticeDueLocked() {
		_ = s.noticeLocked()
	}
}
