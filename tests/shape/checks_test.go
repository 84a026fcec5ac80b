package shape

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
)

// The checks read parsed sources, never the disk, so that checker_test.go can hand them
// small sources of its own and see each one fail.

const (
	// modulePath is the module's import path: an import under it and not under pkg/ is
	// one of the repository's commands, its plugin, its image builder or its tests.
	modulePath = "github.com/buildkite-operator/buildkite-operator"
	// maxFileLines and maxFuncLines are the sizes past which a file or a function is too
	// big to read in one go (issue 26).
	maxFileLines = 400
	maxFuncLines = 80
	// podstateDir is the one package that spells the kubelet's reasons.
	podstateDir = "pkg/podstate"
	// apiDir is the operator's API package, whose Reason constants are its own words.
	apiDir = "pkg/apis/v1alpha1"
)

// productRoots are the folders whose Go files ship: the commands, the library and the
// image builder. Everything else (tests/, examples/, plugin/, hooks/) is not product.
var productRoots = []string{"cmd", "pkg", "image"}

// sourceFile is one parsed Go file, its path relative to the repository's root and
// slash-separated, as the findings name it.
type sourceFile struct {
	rel  string
	src  []byte
	fset *token.FileSet
	file *ast.File
}

// parseSource parses src as the file at rel, keeping its comments (the table-only marker
// and the generated-code marker are comments).
func parseSource(fset *token.FileSet, rel string, src []byte) (sourceFile, error) {
	f, err := parser.ParseFile(fset, rel, src, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return sourceFile{}, fmt.Errorf("parse %s: %w", rel, err)
	}
	return sourceFile{rel: rel, src: src, fset: fset, file: f}, nil
}

// line is the line n is on.
func (s sourceFile) line(n ast.Node) int { return s.fset.Position(n.Pos()).Line }

// finding is one thing wrong (or, for the size check, one oversized function accepted),
// at file:line.
type finding struct {
	rel  string
	line int
	msg  string
}

func (f finding) String() string { return fmt.Sprintf("%s:%d: %s", f.rel, f.line, f.msg) }

// productFiles lists the non-test Go files under root's product folders, as paths relative
// to root. It skips the folders the go command skips (testdata, and names starting with
// "." or "_"), since nothing in them is built.
func productFiles(fsys fs.FS) ([]string, error) {
	var files []string
	for _, top := range productRoots {
		err := fs.WalkDir(fsys, top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := d.Name()
			if d.IsDir() {
				if p != top && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
					return fs.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list the Go files under %s: %w", top, err)
		}
	}
	return files, nil
}

// --- Size: files of at most 400 lines, functions of at most 80 ---------------------------

// tableOnly is the marker that accepts a function over maxFuncLines: one that is mostly a
// table, which reads no better cut in pieces. The reason after it is required.
var tableOnly = regexp.MustCompile(`^//\s*shape:\s*table-only:(.*)$`)

// checkSize reports a file over maxFileLines and each function over maxFuncLines that has
// no table-only marker (or one without a reason), and returns the marked ones as accepted.
// A generated file is exempt: its size is its generator's.
func checkSize(s sourceFile) (violations, accepted []finding) {
	if ast.IsGenerated(s.file) {
		return nil, nil
	}
	if n := lineCount(s.src); n > maxFileLines {
		violations = append(violations, finding{s.rel, 1, fmt.Sprintf(
			"the file has %d lines, over %d: split it into files by concern (types, the main flow, helpers) or move a part into a package of its own",
			n, maxFileLines)})
	}
	for _, fn := range functions(s) {
		n := s.fset.Position(fn.body.End()).Line - fn.line + 1
		if n <= maxFuncLines {
			continue
		}
		reason, marked := markerAbove(s, fn.line)
		switch {
		case marked && reason != "":
			accepted = append(accepted, finding{s.rel, fn.line, fmt.Sprintf("%s has %d lines (table-only: %s)", fn.name, n, reason)})
		case marked:
			violations = append(violations, finding{s.rel, fn.line, fmt.Sprintf(
				"%s has %d lines and a table-only marker without a reason: write why it is only a table after `// shape: table-only:`, or split it",
				fn.name, n)})
		default:
			violations = append(violations, finding{s.rel, fn.line, fmt.Sprintf(
				"%s has %d lines, over %d: cut it into steps with names of their own; if it is only a table, put `// shape: table-only: <why>` on the line above it",
				fn.name, n, maxFuncLines)})
		}
	}
	return violations, accepted
}

// lineCount counts lines as wc -l does, plus a last line without a newline.
func lineCount(src []byte) int {
	n := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

// function is one function to measure: its name, the line its declaration starts on (where
// a marker goes above) and the node whose end ends it.
type function struct {
	name string
	line int
	body ast.Node
}

// functions are the file's function declarations and the function literals declared at
// package level (`var f = func() {...}`). A literal inside a function is measured as part
// of that function.
func functions(s sourceFile) []function {
	var fns []function
	for _, decl := range s.file.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			fns = append(fns, function{funcName(d), s.line(d), d})
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				vs, ok := spec.(*ast.ValueSpec)
				if !ok {
					continue
				}
				ast.Inspect(vs, func(n ast.Node) bool {
					if lit, ok := n.(*ast.FuncLit); ok {
						fns = append(fns, function{"the function literal in " + vs.Names[0].Name, s.line(vs), lit})
						return false
					}
					return true
				})
			}
		}
	}
	return fns
}

// funcName is fn's name as a reader finds it: F, or T.M for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}

// markerAbove finds a table-only marker in the comment that ends on the line above line:
// the declaration's doc comment, or a lone comment right above it. It returns the marker's
// reason and whether there was a marker.
func markerAbove(s sourceFile, line int) (reason string, marked bool) {
	for _, group := range s.file.Comments {
		if s.fset.Position(group.End()).Line != line-1 {
			continue
		}
		for _, c := range group.List {
			if m := tableOnly.FindStringSubmatch(c.Text); m != nil {
				return strings.TrimSpace(m[1]), true
			}
		}
	}
	return "", false
}

// --- Imports: pkg/ imports nothing of cmd/ or the repository's other folders ---------------

// checkImports reports an import, in a product file under pkg/, of the module's root or of
// any of its packages outside pkg/: the commands, the plugin, the image builder, the tests.
// The library is what those are built from; it must build without them.
func checkImports(s sourceFile) []finding {
	if !strings.HasPrefix(s.rel, "pkg/") {
		return nil
	}
	var found []finding
	for _, imp := range s.file.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			continue
		}
		if p != modulePath && !strings.HasPrefix(p, modulePath+"/") {
			continue
		}
		if p == modulePath+"/pkg" || strings.HasPrefix(p, modulePath+"/pkg/") {
			continue
		}
		found = append(found, finding{s.rel, s.line(imp), fmt.Sprintf(
			"imports %s, which is not under pkg/: pkg/ is the library that cmd/, image/ and the tests are built from, so it must not depend on them; move what it needs into a package under pkg/ and import that from both",
			p)})
	}
	return found
}
