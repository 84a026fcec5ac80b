package redact

import (
	"bytes"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Redactor is a compiled set of secrets to replace. It is immutable and safe to share; each
// stream of output gets its own Writer.
//
// Where occurrences of secrets overlap (two secrets sharing bytes, or one repeated over
// itself), the whole overlapping stretch becomes one [REDACTED], so that no part of either
// shows; occurrences that merely touch get one [REDACTED] each. This is the agent's rule too.
type Redactor struct {
	needles [][]byte
	maxLen  int
	// The scan looks at every stride-th position only: a needle at least stride+3 bytes
	// long has stride four-byte windows, at its offsets 0 to stride-1, and one of them
	// starts at a position the scan looks at. windows has a bit set for the hash of each of
	// those windows, so that a position is looked up in byWindow only when its bit is set,
	// which for ordinary output is almost never. The stride is 3 for the shortest secrets
	// (MinLength, 6 bytes) and grows with the shortest needle (see strideFor).
	stride   int
	windows  [filterBits / 64]uint64
	byWindow map[uint32][]window
	// firsts and byFirst index the first window alone, for the undecided tail of the
	// input, where each position is looked at.
	firsts  [filterBits / 64]uint64
	byFirst map[uint32][]int
	// byFirstByte lists the needles starting with each byte, for the last three bytes of
	// the input, too few for a window.
	byFirstByte [256][]int
}

// New compiles secrets. Each is trimmed of surrounding white space; besides the value as
// given, the Redactor looks for the forms in which programs commonly print it: Go- and
// JSON-style quoted (%q), and, for a value of several lines, with CRLF or LF line ends (a
// terminal turns LF into CRLF). Secrets shorter than MinLength are ignored.
func New(secrets ...string) *Redactor {
	r := &Redactor{byWindow: map[uint32][]window{}, byFirst: map[uint32][]int{}}
	seen := map[string]bool{}
	add := func(s string) {
		if len(s) < MinLength || seen[s] {
			return
		}
		seen[s] = true
		r.needles = append(r.needles, []byte(s))
	}
	for _, s := range secrets {
		s = strings.TrimSpace(s)
		forms := []string{s}
		if strings.Contains(s, "\n") {
			lf := strings.ReplaceAll(s, "\r\n", "\n")
			forms = append(forms, lf, strings.ReplaceAll(lf, "\n", "\r\n"))
		}
		for _, f := range forms {
			add(f)
			if q := strconv.Quote(f); len(q) != len(f)+2 {
				add(q[1 : len(q)-1])
			}
		}
	}
	// Longest first, so that the first complete match found at a position is the longest.
	slices.SortStableFunc(r.needles, func(a, b []byte) int { return len(b) - len(a) })
	if len(r.needles) > 0 {
		r.stride = strideFor(len(r.needles[len(r.needles)-1]), len(r.needles))
	}
	for i, n := range r.needles {
		r.maxLen = max(r.maxLen, len(n))
		for off := range r.stride {
			k := key(n[off:])
			setBit(&r.windows, k)
			r.byWindow[k] = append(r.byWindow[k], window{needle: i, offset: off})
		}
		k := key(n)
		setBit(&r.firsts, k)
		r.byFirst[k] = append(r.byFirst[k], i)
		r.byFirstByte[n[0]] = append(r.byFirstByte[n[0]], i)
	}
	// The scan must meet the starts of the windows of one position in increasing order, the
	// longest needle first at each: largest offset first, then longest.
	for _, ws := range r.byWindow {
		slices.SortStableFunc(ws, func(a, b window) int {
			if a.offset != b.offset {
				return b.offset - a.offset
			}
			return len(r.needles[b.needle]) - len(r.needles[a.needle])
		})
	}
	return r
}

// Empty reports that there is nothing to redact.
func (r *Redactor) Empty() bool { return r == nil || len(r.needles) == 0 }

// MaxHold is the most a Writer holds back: one less than the longest secret's length.
func (r *Redactor) MaxHold() int {
	if r.Empty() {
		return 0
	}
	return r.maxLen - 1
}

// Bytes returns p with every secret replaced, as a Writer would write it.
func (r *Redactor) Bytes(p []byte) []byte {
	var out bytes.Buffer
	w := r.NewWriter(&out)
	_, _ = w.Write(p)
	_ = w.Flush()
	return out.Bytes()
}

// String returns s with every secret replaced.
func (r *Redactor) String(s string) string {
	if r.Empty() {
		return s
	}
	return string(r.Bytes([]byte(s)))
}

// at looks at the needles that may start at buf[i:] (at least four bytes): end is just past
// the longest one that occurs there (0 if none); partial reports that buf ends inside one
// that might still occur, which more input will tell (never when final).
func (r *Redactor) at(buf []byte, i int, final bool) (end int, partial bool) {
	rest := buf[i:]
	k := key(rest)
	if h := hash(k); r.firsts[h/64]&(1<<(h%64)) == 0 {
		return 0, false
	}
	for _, ni := range r.byFirst[k] {
		n := r.needles[ni]
		if len(n) <= len(rest) {
			if end == 0 && bytes.Equal(rest[:len(n)], n) {
				end = i + len(n)
			}
		} else if !final && bytes.HasPrefix(n, rest) {
			return 0, true
		}
	}
	return end, false
}

// partialShort reports that rest, fewer than four bytes at the end of the input, is the
// start of a needle.
func (r *Redactor) partialShort(rest []byte) bool {
	for _, ni := range r.byFirstByte[rest[0]] {
		if bytes.HasPrefix(r.needles[ni], rest) {
			return true
		}
	}
	return false
}

// Writer replaces secrets in a stream of writes and passes the result on to its
// destination. It holds back at most MaxHold bytes: those that could be the start of a
// secret whose end has not been written yet. Flush writes them out once the stream ends. A
// Writer is not safe for concurrent use.
type Writer struct {
	r   *Redactor
	dst io.Writer
	// held are the bytes that are not decided yet.
	held []byte
	// open, when above 0, says that the first open bytes of held are inside an occurrence
	// whose [REDACTED] has been written already: more input may extend it (an overlapping
	// occurrence), but never writes a second [REDACTED] for it.
	open int
}

// NewWriter returns a Writer that writes to dst.
func (r *Redactor) NewWriter(dst io.Writer) *Writer {
	return &Writer{r: r, dst: dst}
}

// Held is how many bytes the Writer holds back now.
func (w *Writer) Held() int { return len(w.held) }

// Write replaces the secrets in p, writing what is decided and holding back what is not.
func (w *Writer) Write(p []byte) (int, error) {
	if w.r.Empty() {
		return w.dst.Write(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	data := p
	if len(w.held) > 0 {
		w.held = append(w.held, p...)
		data = w.held
	}
	if err := w.process(data, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held back, the input having ended: a secret that was not completed
// is not one.
func (w *Writer) Flush() error {
	if len(w.held) == 0 {
		w.open = 0
		return nil
	}
	return w.process(w.held, true)
}

// process writes out the decided part of data (held bytes and new input, in order) and
// keeps the rest in w.held.
func (w *Writer) process(data []byte, final bool) error {
	r := w.r
	n := len(data)
	sc := scan{w: w, data: data, inRange: w.open > 0, re: w.open}
	sc.marked = sc.inRange
	// Occurrences that start before tail are complete if they are there at all; those that
	// start in the tail may need input not written yet.
	tail := n
	if !final {
		tail = max(n-(r.maxLen-1), 0)
	}
	p := n // where the undecided part starts
	// The windows looked at start before end: those of occurrences starting before tail,
	// with four bytes of data each.
	st := r.stride
	end := min(tail+st-1, n-3)
	f := &r.windows
	j := 0
	// Four windows at a time, their filter bits tested together: for ordinary output none
	// is set, and one branch instead of four makes the scan about twice as fast.
	for ; j+3*st < end; j += 4 * st {
		d := data[j : j+3*st+4]
		h0 := hash(key(d[0:]))
		h1 := hash(key(d[st:]))
		h2 := hash(key(d[2*st:]))
		h3 := hash(key(d[3*st:]))
		if (f[h0/64]>>(h0%64)|f[h1/64]>>(h1%64)|f[h2/64]>>(h2%64)|f[h3/64]>>(h3%64))&1 == 0 {
			continue
		}
		for q := range 4 {
			if err := r.window(&sc, data, j+q*st, tail); err != nil {
				return err
			}
		}
	}
	for ; j < end; j += st {
		if err := r.window(&sc, data, j, tail); err != nil {
			return err
		}
	}
	for i := tail; i < n; i++ {
		if i+4 > n {
			if r.partialShort(data[i:]) {
				p = i
				break
			}
			continue
		}
		end, partial := r.at(data, i, final)
		if partial {
			p = i
			break
		}
		if end > 0 {
			if err := sc.found(i, end); err != nil {
				return err
			}
		}
	}
	if sc.inRange && sc.re <= p {
		if err := sc.closeRange(); err != nil {
			return err
		}
	}
	open := 0
	if sc.inRange {
		// The range may still grow: an occurrence starting in the undecided part would
		// overlap it. Its start is final, so its [REDACTED] goes out now.
		if err := sc.writeRangeStart(); err != nil {
			return err
		}
		open = sc.re - p
	} else if err := w.emit(data[sc.c:p]); err != nil {
		return err
	}
	// Keep the undecided part; data may be w.held itself, so copy within.
	w.held = append(w.held[:0], data[p:]...)
	w.open = open
	return nil
}

// window adds to sc the occurrences, starting before tail, of the needles with a window at
// data[j:].
func (r *Redactor) window(sc *scan, data []byte, j, tail int) error {
	k := key(data[j:])
	if h := hash(k); r.windows[h/64]&(1<<(h%64)) == 0 {
		return nil
	}
	for _, win := range r.byWindow[k] {
		s := j - win.offset
		if s < 0 || s >= tail {
			continue
		}
		nd := r.needles[win.needle]
		if s+len(nd) <= len(data) && bytes.Equal(data[s:s+len(nd)], nd) {
			if err := sc.found(s, s+len(nd)); err != nil {
				return err
			}
		}
	}
	return nil
}

// scan merges the occurrences found in one process call, met in order of their starts.
type scan struct {
	w    *Writer
	data []byte
	// c: data before it is written out, or covered by a [REDACTED] written.
	c int
	// rs, re: the current range of overlapping occurrences, when inRange.
	rs, re  int
	inRange bool
	// marked: the current range's [REDACTED] is written.
	marked bool
}

// found adds the occurrence [s, e).
func (sc *scan) found(s, e int) error {
	if sc.inRange && s < sc.re {
		sc.re = max(sc.re, e)
		return nil
	}
	if sc.inRange {
		if err := sc.closeRange(); err != nil {
			return err
		}
	}
	sc.inRange, sc.rs, sc.re, sc.marked = true, s, e, false
	return nil
}

// writeRangeStart writes what precedes the current range, and its [REDACTED].
func (sc *scan) writeRangeStart() error {
	if err := sc.w.emit(sc.data[sc.c:sc.rs]); err != nil {
		return err
	}
	if !sc.marked {
		sc.marked = true
		return sc.w.emit(replacement)
	}
	return nil
}

// closeRange ends the current range: nothing can extend it any more.
func (sc *scan) closeRange() error {
	if err := sc.writeRangeStart(); err != nil {
		return err
	}
	sc.c, sc.inRange = sc.re, false
	return nil
}

var replacement = []byte(Replacement)

func (w *Writer) emit(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	_, err := w.dst.Write(p)
	return err
}
