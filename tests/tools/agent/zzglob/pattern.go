// Package zzglob is the project's own implementation of the part of drjosh.dev/zzglob that
// buildkite-agent v3.138 calls: Parse, Pattern.Match, Pattern.Glob and MultiGlob, with the
// options ExpandTilde, WalkIntermediateDirs and TraverseSymlinks. The module proxy refuses
// the original, so the agent is built against this one (tests/tools/agent replaces it).
//
// The syntax is Buildkite's documented glob syntax for artifact paths and if_changed:
//
//	\       escapes the next character (\* matches a literal *)
//	/       the path separator; matches itself only
//	?       one character other than /
//	*       zero or more characters other than /
//	**      zero or more characters including /; a whole segment "**/" also matches
//	        nothing, so a/**/b matches a/b and **/*.log matches x.log
//	{a,b}   a or b; parts may be empty and may hold /, *, ** and further braces;
//	        \, is a literal comma inside braces
//	[abc]   one of the listed characters; [^abc] one character not listed. There are no
//	        ranges: - is literal. A class never matches /
//	~       at the very start (alone or before /), the user's home directory
//
// Patterns must match whole paths; a path matches when it is spelled as the pattern
// spells it (no cleaning: "./a" is not "a").
package zzglob

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// maxAlternatives bounds the expansion of braces and "**/" segments, each of which
// multiplies the alternatives a pattern stands for, so that a hostile pattern fails to
// parse instead of exhausting memory.
const maxAlternatives = 4096

// ParseOption changes how Parse reads a pattern.
type ParseOption = func(*parseConfig)

type parseConfig struct {
	expandTilde bool
}

// ExpandTilde turns the expansion of a leading ~ into the user's home directory on or
// off. It is on by default; the agent turns it off for cache keys, where ~ is a literal
// directory in the job's working directory.
func ExpandTilde(enable bool) ParseOption {
	return func(c *parseConfig) { c.expandTilde = enable }
}

// Pattern is a parsed glob pattern. It is safe for concurrent use.
type Pattern struct {
	source string
	m      *machine
	// roots are the fixed directories (or, for a pattern without wildcards, the one
	// path) where a walk starts: the literal leading segments of each alternative,
	// with those under another root dropped so that no path is walked twice. The
	// empty root means the current directory.
	roots []string
}

// String returns the pattern as it was given to Parse.
func (p *Pattern) String() string { return p.source }

// Parse parses a glob pattern.
func Parse(pattern string, opts ...ParseOption) (*Pattern, error) {
	cfg := parseConfig{expandTilde: true}
	for _, o := range opts {
		o(&cfg)
	}
	text := pattern
	if cfg.expandTilde && (text == "~" || strings.HasPrefix(text, "~/")) {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, fmt.Errorf("zzglob: expanding ~ in %q: %w", pattern, err)
		}
		// The home directory is a literal path; escaping keeps a [ or { in it from
		// being read as syntax.
		text = escape(home) + text[1:]
	}
	alts, err := expandBraces(text)
	if err != nil {
		return nil, fmt.Errorf("zzglob: parsing %q: %w", pattern, err)
	}
	var seqs [][]token
	for _, alt := range alts {
		toks, err := tokenize(alt)
		if err != nil {
			return nil, fmt.Errorf("zzglob: parsing %q: %w", pattern, err)
		}
		// Each whole "**/" segment doubles the alternatives; check before expanding.
		if n := countWholeSegmentDstars(toks); n > 12 || len(seqs)+1<<n > maxAlternatives {
			return nil, fmt.Errorf("zzglob: parsing %q: more than %d alternatives", pattern, maxAlternatives)
		}
		seqs = append(seqs, optionalSegments(toks)...)
	}
	return &Pattern{source: pattern, m: compile(seqs), roots: walkRoots(seqs)}, nil
}

// Match reports whether path, a slash-separated path, matches the whole pattern.
func (p *Pattern) Match(path string) bool {
	return p.m.matches(p.m.advance(p.m.start(), path))
}

// escape backslash-escapes every character that the syntax gives a meaning.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*?[]{},`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// expandBraces rewrites a pattern with braces as the list of brace-free patterns it stands
// for, keeping escapes and classes intact for tokenize: "a{b,c{d,e}}f" gives abf, acdf,
// acef.
func expandBraces(s string) ([]string, error) {
	open, err := scan(s, 0, func(i int, r byte) bool { return r == '{' })
	if err != nil {
		return nil, err
	}
	if open < 0 {
		return []string{s}, nil
	}
	// Split what lies between the braces on its own commas, not those of nested braces.
	var parts []string
	depth, start, end := 0, open+1, -1
	_, err = scan(s, open+1, func(i int, r byte) bool {
		switch {
		case r == '{':
			depth++
		case r == '}' && depth > 0:
			depth--
		case r == '}':
			parts, end = append(parts, s[start:i]), i
			return true
		case r == ',' && depth == 0:
			parts, start = append(parts, s[start:i]), i+1
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	if end < 0 {
		return nil, errors.New("unclosed {")
	}
	var out []string
	for _, part := range parts {
		more, err := expandBraces(s[:open] + part + s[end+1:])
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
		if len(out) > maxAlternatives {
			return nil, fmt.Errorf("more than %d alternatives", maxAlternatives)
		}
	}
	return out, nil
}

// scan calls stop for each byte of s from index from that is syntax (not escaped, not
// inside a [class]) until stop returns true, and returns that index, or -1.
func scan(s string, from int, stop func(i int, r byte) bool) (int, error) {
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++ // the escaped byte is never syntax; tokenize reports a trailing \
		case '[':
			end, err := classEnd(s, i)
			if err != nil {
				return -1, err
			}
			i = end
		default:
			if stop(i, s[i]) {
				return i, nil
			}
		}
	}
	return -1, nil
}

// classEnd returns the index of the ] that closes the class opening at s[open].
func classEnd(s string, open int) (int, error) {
	for i := open + 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case ']':
			return i, nil
		}
	}
	return -1, errors.New("unclosed [")
}
