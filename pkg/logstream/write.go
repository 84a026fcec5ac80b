package logstream

import (
	"slices"
	"time"
)

// sectionHoldoff is how long WriteSection waits for the main output to finish a line before
// it breaks the line to insert its section.
const sectionHoldoff = time.Second

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
