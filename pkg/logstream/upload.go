package logstream

import "time"

// upload sends chunks in order, up to conf.Uploaders at once, and settles them strictly in
// order as they come back, until the stream is closed and drained.
func (s *Stream) upload() {
	defer close(s.done)
	// The chunks go to conf.Uploaders senders that last as long as the stream, rather than
	// to a goroutine each: a new goroutine grew its stack through gzip and HTTP for every
	// chunk, 3 % of the supervisor's CPU. A flight is handed over only while fewer than
	// conf.Uploaders are unsettled, so the channel always has room and a sender is free or
	// about to be.
	flights := make(chan *flight, s.conf.Uploaders)
	defer close(flights) // the senders end once their flight is done
	for range s.conf.Uploaders {
		go s.sender(flights)
	}
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
				flights <- f
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

// sender uploads the chunks it is handed, one at a time, and reports each back to the
// uploader.
func (s *Stream) sender(flights <-chan *flight) {
	for f := range flights {
		err := s.conf.Upload(s.ctx, f.seq, f.off, f.data)
		s.mu.Lock()
		f.done, f.err = true, err
		s.cond.Broadcast()
		s.mu.Unlock()
	}
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
