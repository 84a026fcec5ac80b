package zzglob

import (
	"errors"
	"slices"
	"strings"
	"unicode/utf8"
)

type kind uint8

const (
	lit   kind = iota // one given rune
	one               // ?
	class             // [abc] or [^abc]
	star              // *
	dstar             // **
	end               // the end of one alternative: the path matches if a state is here
)

type token struct {
	kind kind
	r    rune   // lit
	set  string // class: its members
	neg  bool   // class: [^...]
}

// tokenize reads one brace-free alternative.
func tokenize(s string) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\\':
			if i+size >= len(s) {
				return nil, errors.New(`trailing \`)
			}
			e, esize := utf8.DecodeRuneInString(s[i+size:])
			toks = append(toks, token{kind: lit, r: e})
			size += esize
		case '*':
			n := len(s[i:]) - len(strings.TrimLeft(s[i:], "*"))
			toks = append(toks, token{kind: star})
			if n > 1 {
				toks[len(toks)-1].kind = dstar
			}
			size = n
		case '?':
			toks = append(toks, token{kind: one})
		case '[':
			close, err := classEnd(s, i)
			if err != nil {
				return nil, err
			}
			t, err := parseClass(s[i+1 : close])
			if err != nil {
				return nil, err
			}
			toks = append(toks, t)
			size = close + 1 - i
		default:
			toks = append(toks, token{kind: lit, r: r})
		}
		i += size
	}
	return toks, nil
}

// parseClass reads what lies between [ and ]. Buildkite's syntax has no ranges, so - is
// a member like any other.
func parseClass(body string) (token, error) {
	t := token{kind: class}
	if strings.HasPrefix(body, "^") {
		t.neg, body = true, body[1:]
	}
	var members strings.Builder
	for i := 0; i < len(body); i++ {
		if body[i] == '\\' {
			i++ // classEnd has made sure an escape is never the last byte
		}
		members.WriteByte(body[i])
	}
	if members.Len() == 0 {
		return token{}, errors.New("empty character class")
	}
	t.set = members.String()
	return t, nil
}

// optionalSegments returns the alternatives that a whole "**/" segment stands for: with it
// (any run of directories) and without it (none), so that a/**/b also matches a/b.
func optionalSegments(toks []token) [][]token {
	for i := range toks {
		if !wholeSegmentDstar(toks, i) {
			continue
		}
		var out [][]token
		for _, rest := range optionalSegments(toks[i+2:]) {
			out = append(out,
				slices.Concat(toks[:i+2], rest), // keeps "**/"
				slices.Concat(toks[:i], rest))   // drops it
		}
		return out
	}
	return [][]token{toks}
}

func wholeSegmentDstar(toks []token, i int) bool {
	isSlash := func(j int) bool { return toks[j].kind == lit && toks[j].r == '/' }
	return toks[i].kind == dstar && (i == 0 || isSlash(i-1)) && i+1 < len(toks) && isSlash(i+1)
}

func countWholeSegmentDstars(toks []token) int {
	n := 0
	for i := range toks {
		if wholeSegmentDstar(toks, i) {
			n++
		}
	}
	return n
}

// machine is a nondeterministic automaton over the tokens of every alternative, laid end
// to end, each alternative closed by an end token. A state is the index of the token that
// is to match next. Running it a rune at a time lets Glob carry the states of a directory
// down to its entries and prune a directory as soon as no state survives it.
type machine struct {
	toks   []token
	starts []int
}

// states is a set of machine states (indexes into toks), without duplicates.
type states []int

func compile(alts [][]token) *machine {
	m := &machine{}
	for _, alt := range alts {
		m.starts = append(m.starts, len(m.toks))
		m.toks = append(m.toks, alt...)
		m.toks = append(m.toks, token{kind: end})
	}
	return m
}

// add puts state i into the set with every state reachable from it without reading: a
// star may match nothing, so the token after it may match next.
func (m *machine) add(set states, seen []bool, i int) states {
	for ; !seen[i]; i++ {
		seen[i] = true
		set = append(set, i)
		if k := m.toks[i].kind; k != star && k != dstar {
			break
		}
	}
	return set
}

func (m *machine) start() states {
	seen := make([]bool, len(m.toks))
	var set states
	for _, i := range m.starts {
		set = m.add(set, seen, i)
	}
	return set
}

// advance reads s from the given states.
func (m *machine) advance(set states, s string) states {
	for _, c := range s {
		if len(set) == 0 {
			break
		}
		seen := make([]bool, len(m.toks))
		var next states
		for _, i := range set {
			t := m.toks[i]
			switch t.kind {
			case lit:
				if c == t.r {
					next = m.add(next, seen, i+1)
				}
			case one:
				if c != '/' {
					next = m.add(next, seen, i+1)
				}
			case class:
				if c != '/' && strings.ContainsRune(t.set, c) != t.neg {
					next = m.add(next, seen, i+1)
				}
			case star:
				if c != '/' {
					next = m.add(next, seen, i)
				}
			case dstar:
				next = m.add(next, seen, i)
			}
		}
		set = next
	}
	return set
}

// matches reports whether the input read so far matches an alternative completely.
func (m *machine) matches(set states) bool {
	return slices.ContainsFunc(set, func(i int) bool { return m.toks[i].kind == end })
}

// alive reports whether some longer input could still match.
func (m *machine) alive(set states) bool {
	return slices.ContainsFunc(set, func(i int) bool { return m.toks[i].kind != end })
}

// walkRoots returns where walks for these alternatives start: for each, its literal
// leading directories (or all of it when it has no wildcard), keeping only the roots that
// no other root's walk reaches.
func walkRoots(alts [][]token) []string {
	var roots []string
	for _, alt := range alts {
		var b strings.Builder
		all := true
		for _, t := range alt {
			if t.kind != lit {
				all = false
				break
			}
			b.WriteRune(t.r)
		}
		root := b.String()
		if !all {
			switch i := strings.LastIndexByte(root, '/'); {
			case i == 0:
				root = "/"
			case i < 0:
				root = ""
			default:
				root = root[:i]
			}
		}
		roots = append(roots, root)
	}
	slices.Sort(roots)
	roots = slices.Compact(roots)
	return slices.DeleteFunc(slices.Clone(roots), func(r string) bool {
		return slices.ContainsFunc(roots, func(q string) bool { return q != r && reaches(q, r) })
	})
}

// reaches reports whether a walk from root q visits the path r: r lies below q through
// names a directory listing gives (never "", "." or "..").
func reaches(q, r string) bool {
	var rest string
	switch {
	case q == "":
		rest = r
	case strings.HasSuffix(q, "/") && strings.HasPrefix(r, q):
		rest = r[len(q):]
	case strings.HasPrefix(r, q+"/"):
		rest = r[len(q)+1:]
	default:
		return false
	}
	for seg := range strings.SplitSeq(rest, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}
