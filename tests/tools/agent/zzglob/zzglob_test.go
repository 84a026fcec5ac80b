package zzglob

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern string
		opts    []ParseOption
		yes     []string
		no      []string
	}{
		{pattern: "*.txt", yes: []string{"a.txt", ".txt", "x.y.txt"}, no: []string{"a/b.txt", "a.txt/", "a.log"}},
		{pattern: "**/*.log", yes: []string{"x.log", "a/x.log", "a/b/c/x.log"}, no: []string{"a/x.txt", "x.log/y"}},
		{pattern: "a/**/b", yes: []string{"a/b", "a/x/b", "a/x/y/b"}, no: []string{"ab", "a/xb", "a/b/c"}},
		{pattern: "a/**", yes: []string{"a/", "a/x", "a/x/y"}, no: []string{"a", "b/x"}},
		{pattern: "a**b", yes: []string{"ab", "axb", "a/x/b"}, no: []string{"a/x/c"}},
		{pattern: "{a,b}/*.txt", yes: []string{"a/x.txt", "b/y.txt"}, no: []string{"c/x.txt", "ab/x.txt"}},
		{pattern: "{,x}y", yes: []string{"y", "xy"}, no: []string{"xxy"}},
		{pattern: "x{a,{b,c}d}", yes: []string{"xa", "xbd", "xcd"}, no: []string{"xb", "xad"}},
		{pattern: "{a/*,**/b}.go", yes: []string{"a/x.go", "b.go", "p/q/b.go"}, no: []string{"a/x/y.go"}},
		{pattern: "[abc]", yes: []string{"a", "c"}, no: []string{"d", "ab", ""}},
		{pattern: "[^abc]", yes: []string{"d", "-"}, no: []string{"a", "/"}},
		{pattern: "x[/]y", no: []string{"x/y"}},                                           // a class never matches the separator
		{pattern: "[c-g]", yes: []string{"c", "-", "g"}, no: []string{"d", "e"}},          // no ranges
		{pattern: `[\]x]`, yes: []string{"]", "x"}, no: []string{`\`}},                    // an escape inside a class
		{pattern: "?", yes: []string{"a", "é"}, no: []string{"/", "", "ab"}},              // one character, not one byte
		{pattern: `\*`, yes: []string{"*"}, no: []string{"a", ""}},                        // escaped star
		{pattern: `\{a,b\}`, yes: []string{"{a,b}"}, no: []string{"a", "b"}},              // escaped braces
		{pattern: `{a\,b,c}`, yes: []string{"a,b", "c"}, no: []string{"a", "b"}},          // escaped comma in braces
		{pattern: "a}b,c", yes: []string{"a}b,c"}},                                        // stray } and , are literal
		{pattern: "[{]x", yes: []string{"{x"}},                                            // a brace in a class is not a group
		{pattern: "~", opts: []ParseOption{ExpandTilde(false)}, yes: []string{"~"}},       // literal
		{pattern: "~/x", opts: []ParseOption{ExpandTilde(false)}, yes: []string{"~/x"}},   // literal
		{pattern: "a~/x", yes: []string{"a~/x"}},                                          // only a leading ~ expands
		{pattern: "~/x", yes: []string{"/home/[me]/x"}, no: []string{"~/x", "/home/m/x"}}, // expanded, and the home escaped
		{pattern: "~", yes: []string{"/home/[me]"}, no: []string{"~"}},                    // expanded alone
		{pattern: "~user/x", yes: []string{"~user/x"}},                                    // no other users' homes
		{pattern: "./a/*.txt", yes: []string{"./a/x.txt"}, no: []string{"a/x.txt"}},       // no cleaning
		{pattern: "/abs/**/*.log", yes: []string{"/abs/x.log", "/abs/a/x.log"}, no: []string{"abs/x.log"}},
	}
	t.Setenv("HOME", "/home/[me]")
	for _, tc := range tests {
		p, err := Parse(tc.pattern, tc.opts...)
		if err != nil {
			t.Errorf("Parse(%q) = %v", tc.pattern, err)
			continue
		}
		for _, path := range tc.yes {
			if !p.Match(path) {
				t.Errorf("Parse(%q).Match(%q) = false, want true", tc.pattern, path)
			}
		}
		for _, path := range tc.no {
			if p.Match(path) {
				t.Errorf("Parse(%q).Match(%q) = true, want false", tc.pattern, path)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, pattern := range []string{
		"{a,b",
		"a/{b,{c,d}",
		"[ab",
		`a\`,
		"[]",
		"[^]",
		`[a\]`,
		strings.Repeat("{a,b,c,d}", 7),  // 4^7 alternatives
		strings.Repeat("**/", 13) + "x", // 2^13 alternatives
	} {
		if _, err := Parse(pattern); err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", pattern)
		}
	}
}

// tree makes a directory tree in a temporary directory, changes into it and returns it.
// Entries ending in / are directories; "name -> target" is a symlink.
func tree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, entry := range []string{
		"a.txt", "b.txt", "c.log", ".hidden.log",
		"a/x.txt", "a/y.log", "a/deep/z.log",
		"b/x.txt", "c/x.txt",
		"logs/one.log", "logs/sub/two.log",
		"f-1", "f_1", "fz1", "star*.txt", "comma,x", "~/t.txt",
		"link-dir -> a", "link-file.txt -> a.txt", "broken.txt -> missing",
		"loop/back -> ..", // a symlink to an ancestor
	} {
		name, target, link := strings.Cut(entry, " -> ")
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if link {
			err = os.Symlink(target, path)
		} else {
			err = os.WriteFile(path, []byte(name), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(root)
	return root
}

// collect globs and returns the paths passed to the callback, in order.
func collect(t *testing.T, p *Pattern, opts ...GlobOption) []string {
	t.Helper()
	var got []string
	err := p.Glob(func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Errorf("Glob(%q) callback got error for %q: %v", p, path, err)
			return nil
		}
		got = append(got, path)
		return nil
	}, opts...)
	if err != nil {
		t.Errorf("Glob(%q) = %v", p, err)
	}
	return got
}

func TestGlob(t *testing.T) {
	root := tree(t)
	t.Setenv("HOME", root)
	noLinks := []GlobOption{TraverseSymlinks(false)}
	tests := []struct {
		pattern   string
		parseOpts []ParseOption
		opts      []GlobOption
		want      []string
	}{
		// A symlink that matches is passed on whether or not it resolves.
		{pattern: "*.txt", want: []string{"a.txt", "b.txt", "broken.txt", "link-file.txt", "star*.txt"}},
		{pattern: "**/*.log", opts: noLinks, want: []string{
			".hidden.log", "a/deep/z.log", "a/y.log", "c.log", "logs/one.log", "logs/sub/two.log"}},
		// Traversed, the symlinked directory is walked too, but loop/back (the root
		// itself) is not walked again.
		{pattern: "**/*.log", want: []string{
			".hidden.log", "a/deep/z.log", "a/y.log", "c.log",
			"link-dir/deep/z.log", "link-dir/y.log", "logs/one.log", "logs/sub/two.log"}},
		{pattern: "{a,b}/*.txt", want: []string{"a/x.txt", "b/x.txt"}},
		{pattern: "{*.log,a/*.log}", want: []string{".hidden.log", "a/y.log", "c.log"}},
		{pattern: "[ab].txt", want: []string{"a.txt", "b.txt"}},
		{pattern: "?.log", want: []string{"c.log"}},
		{pattern: "f[a-z]1", want: []string{"f-1", "fz1"}}, // - is literal, not a range
		{pattern: "f[^-]1", want: []string{"f_1", "fz1"}},
		{pattern: `*\*.txt`, want: []string{"star*.txt"}},
		{pattern: `{comma\,x,nothing}`, want: []string{"comma,x"}},
		{pattern: "a/**", opts: noLinks, want: []string{"a/deep", "a/deep/z.log", "a/x.txt", "a/y.log"}},
		{pattern: "a/**/x.txt", want: []string{"a/x.txt"}},
		{pattern: "logs/*/two.log", want: []string{"logs/sub/two.log"}},
		{pattern: "a.txt", want: []string{"a.txt"}},
		{pattern: "missing.txt", want: nil},
		{pattern: "missing/*.txt", want: nil},
		{pattern: "a.txt/*", want: nil},
		{pattern: "./a/*.txt", want: []string{"./a/x.txt"}},
		{pattern: filepath.Join(root, "b", "*.txt"), want: []string{filepath.Join(root, "b", "x.txt")}},
		{pattern: "~/a/*.txt", want: []string{filepath.Join(root, "a", "x.txt")}},
		{pattern: "~/*.txt", parseOpts: []ParseOption{ExpandTilde(false)}, want: []string{"~/t.txt"}},
		// A symlink the pattern spells out is followed, as the OS would; one reached by
		// a wildcard is only entered when traversing.
		{pattern: "link-dir/*.txt", opts: noLinks, want: []string{"link-dir/x.txt"}},
		{pattern: "*/x.txt", opts: noLinks, want: []string{"a/x.txt", "b/x.txt", "c/x.txt"}},
		{pattern: "*/x.txt", want: []string{"a/x.txt", "b/x.txt", "c/x.txt", "link-dir/x.txt"}},
		// Intermediate directories: every directory walked because the pattern may
		// match below it, the match a/deep once.
		{pattern: "**/deep", opts: []GlobOption{TraverseSymlinks(false), WalkIntermediateDirs(true)},
			want: []string{"a", "a/deep", "b", "c", "logs", "logs/sub", "loop", "~"}},
		{pattern: "logs/**/two.log", opts: []GlobOption{WalkIntermediateDirs(true)},
			want: []string{"logs", "logs/sub", "logs/sub/two.log"}},
	}
	for _, tc := range tests {
		p, err := Parse(tc.pattern, tc.parseOpts...)
		if err != nil {
			t.Errorf("Parse(%q) = %v", tc.pattern, err)
			continue
		}
		if got := collect(t, p, tc.opts...); !slices.Equal(got, tc.want) {
			t.Errorf("Glob(%q) = %q, want %q", tc.pattern, got, tc.want)
		}
	}
}

func TestGlobCallbackControl(t *testing.T) {
	tree(t)
	p, err := Parse("**/*.log")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		fn   func(path string) error
		want []string
		err  error
	}{
		{"SkipDir on an intermediate directory", func(path string) error {
			if path == "a" {
				return fs.SkipDir
			}
			return nil
		}, []string{".hidden.log", "a", "b", "c", "c.log", "logs", "logs/one.log", "logs/sub", "logs/sub/two.log", "loop", "~"}, nil},
		{"SkipDir on a file skips the rest of its directory", func(path string) error {
			if path == "logs/one.log" {
				return fs.SkipDir
			}
			return nil
		}, []string{".hidden.log", "a", "a/deep", "a/deep/z.log", "a/y.log", "b", "c", "c.log", "logs", "logs/one.log", "loop", "~"}, nil},
		{"SkipAll stops without an error", func(path string) error {
			if path == "a/deep" {
				return fs.SkipAll
			}
			return nil
		}, []string{".hidden.log", "a", "a/deep"}, nil},
		{"an error stops and is returned", func(path string) error {
			if path == "c.log" {
				return errBoom
			}
			return nil
		}, []string{".hidden.log", "a", "a/deep", "a/deep/z.log", "a/y.log", "b", "c", "c.log"}, errBoom},
	}
	for _, tc := range tests {
		var got []string
		err := p.Glob(func(path string, d fs.DirEntry, err error) error {
			got = append(got, path)
			return tc.fn(path)
		}, TraverseSymlinks(false), WalkIntermediateDirs(true))
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("%s: Glob = %v, want %v", tc.name, err, tc.err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: visited %q, want %q", tc.name, got, tc.want)
		}
	}
}

var errBoom = errors.New("boom")

func TestGlobErrors(t *testing.T) {
	root := tree(t)
	if os.Geteuid() == 0 {
		t.Log("running as root: the unreadable-directory case cannot fail to read")
	}
	locked := filepath.Join(root, "locked")
	if err := os.Mkdir(locked, 0o000); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		pattern  string
		opts     []GlobOption
		wantPath string // the path the callback gets an error for; "" for none
		wantErr  error
	}{
		// A missing root means no match, unless intermediate directories are asked for.
		{pattern: "missing/*.txt", wantPath: ""},
		{pattern: "missing/*.txt", opts: []GlobOption{WalkIntermediateDirs(true)}, wantPath: "missing", wantErr: fs.ErrNotExist},
		{pattern: "locked/*.txt", wantPath: "locked", wantErr: fs.ErrPermission},
	}
	for _, tc := range tests {
		if tc.wantErr == fs.ErrPermission && os.Geteuid() == 0 {
			continue
		}
		p, err := Parse(tc.pattern)
		if err != nil {
			t.Fatal(err)
		}
		var gotPath string
		var gotErr error
		err = p.Glob(func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				gotPath, gotErr = path, err
			}
			return nil
		}, tc.opts...)
		if err != nil {
			t.Errorf("Glob(%q) = %v", tc.pattern, err)
		}
		if gotPath != tc.wantPath || (tc.wantErr != nil && !errors.Is(gotErr, tc.wantErr)) {
			t.Errorf("Glob(%q): callback error for %q: %v, want for %q: %v", tc.pattern, gotPath, gotErr, tc.wantPath, tc.wantErr)
		}
	}
}

func TestMultiGlob(t *testing.T) {
	tree(t)
	var patterns []*Pattern
	for _, s := range []string{"a/*.txt", "{b,c}/x.txt", "a/x.txt"} {
		p, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		patterns = append(patterns, p)
	}
	var got []string
	err := MultiGlob(context.Background(), patterns, func(path string, d fs.DirEntry, err error) error {
		got = append(got, path)
		return err
	})
	if err != nil {
		t.Fatalf("MultiGlob = %v", err)
	}
	// Pattern by pattern; a path two patterns match comes twice (the agent dedups).
	if want := []string{"a/x.txt", "b/x.txt", "c/x.txt", "a/x.txt"}; !slices.Equal(got, want) {
		t.Errorf("MultiGlob visited %q, want %q", got, want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = MultiGlob(ctx, patterns, func(string, fs.DirEntry, error) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("MultiGlob with a cancelled context = %v, want context.Canceled", err)
	}
}
