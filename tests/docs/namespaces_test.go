// Package docs_test checks what the project tells its users against what it does: here, that
// nothing the user reads places BuildEnvironments, BuildJobs or job pods in the operator's own
// namespace. The operator keeps only its own Secrets and Lease there (`buildkite` by default);
// everything of its jobs lives in the job namespace (`buildkite-jobs` by default), and a
// user who looks for an environment beside the operator finds nothing.
package docs_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// repoRoot is the module's root, from this package's directory.
const repoRoot = "../.."

var (
	// operatorNamespace is a phrase naming the operator's own namespace. `buildkite` is its
	// default name; `buildkite-jobs`, the job namespace's, must not match.
	operatorNamespace = regexp.MustCompile("(?i)\\b(?:the |its )?operator'?s (?:own )?namespace\\b|" +
		"\\bnamespace of the operator\\b|\\b(?:the )?operator namespace\\b|\\bsame namespace as the operator\\b|" +
		"(?:\\bthe |\\b(?:in|into|from|of) )`?buildkite`? namespace\\b|\\bnamespace `?buildkite\\b`?(?:[^-\\w`]|$)")
	// jobObject is something that lives in the job namespace: the operator's resources,
	// job pods, and what an environment gives them (volumes' claims, Secrets and
	// ServiceAccounts named by it are in the pod's namespace too).
	jobObject = regexp.MustCompile("(?i)\\bBuild ?Environments?\\b|\\bbuild environments?\\b|\\bBuild ?Jobs?\\b|" +
		"\\bbenv\\b|\\bjob(?:'s|s'|s)? pods?\\b|\\bpods? of (?:a |the |each )?jobs?\\b|\\bPersistentVolumeClaims?\\b|\\bPVCs?\\b|" +
		"\\b(?:job )?token Secrets?\\b")
	// negated is a phrase saying the operator's namespace is not the place, just before it.
	negated = regexp.MustCompile(`(?i)\b(?:not|never|nor|rather than|instead of|outside)(?: in| of| from)?(?: the| its)? *$`)
	// clauseEnd separates clauses: a sentence's end, a semicolon, a table cell.
	clauseEnd = regexp.MustCompile(`[.;!?](?:\s|$)|\|`)
	// kubectlNamespace aims a command at the operator's namespace (`-n buildkite`,
	// `--namespace buildkite`, `--namespace=buildkite`); kubectlJobs is a kubectl command on
	// the job namespace's resources.
	kubectlNamespace = regexp.MustCompile(`(?:^|\s)(?:-n|--namespace)[= ]buildkite(?:[^-\w]|$)`)
	kubectlJobs      = regexp.MustCompile(`(?i)\bkubectl\b.*\b(?:buildjobs?|bj|buildenvironments?|benv)(?:\.buildkite-operator\.dev)?\b`)
	// manifestNamespace is a BuildEnvironment's or BuildJob's metadata.namespace naming
	// the operator's.
	manifestKind      = regexp.MustCompile(`(?m)^kind:\s*(?:BuildEnvironment|BuildJob)\s*$`)
	manifestNamespace = regexp.MustCompile(`(?m)^[ \t]+namespace:[ \t]*["']?buildkite["']?[ \t]*$`)
)

// problem is one place that puts the job namespace's objects in the operator's namespace.
type problem struct {
	file string
	line int
	text string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.text) }

// prose is text joined from lines, with each line's offset kept to name lines.
type prose struct {
	text   string
	starts []int // offset in text of each line's first character
	lines  []int // that line's number in the file
}

// commentMark is what starts a comment line in the files scanned (YAML, shell, Go), and
// Markdown's quote; it is dropped so that a sentence wrapped over comment lines reads whole.
var commentMark = regexp.MustCompile(`^\s*(?:#+|//+|>)?\s*`)

// joinLines joins a file's lines into prose, one space between lines; a blank line ends the
// clause before it, as a paragraph's end does.
func joinLines(content string, firstLine int) prose {
	var p prose
	var b strings.Builder
	for i, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(commentMark.ReplaceAllString(line, ""))
		if line == "" {
			b.WriteString(" | ")
			continue
		}
		p.starts = append(p.starts, b.Len())
		p.lines = append(p.lines, firstLine+i)
		b.WriteString(line)
		b.WriteByte(' ')
	}
	p.text = b.String()
	return p
}

// lineAt is the file's line number of offset off in p.text.
func (p prose) lineAt(off int) int {
	i := sort.SearchInts(p.starts, off+1) - 1
	if i < 0 {
		return p.lines[0]
	}
	return p.lines[i]
}

// wrongNamespaceProse finds the clauses of text that name one of the job namespace's objects
// and the operator's namespace, the latter not negated ("not the operator's namespace").
// It returns the offsets of the phrases naming the operator's namespace.
func wrongNamespaceProse(text string) []int {
	var found []int
	start := 0
	ends := clauseEnd.FindAllStringIndex(text, -1)
	ends = append(ends, []int{len(text), len(text)})
	for _, end := range ends {
		clause := text[start:end[0]]
		if jobObject.MatchString(clause) {
			for _, m := range operatorNamespace.FindAllStringIndex(clause, -1) {
				if !negated.MatchString(clause[:m[0]]) {
					found = append(found, start+m[0])
				}
			}
		}
		start = end[1]
	}
	return found
}

// wrongKubectl says whether line runs kubectl on BuildJobs or BuildEnvironments in the
// operator's namespace.
func wrongKubectl(line string) bool {
	return kubectlJobs.MatchString(line) && kubectlNamespace.MatchString(line)
}

// checkText returns the problems of a text file.
func checkText(file, content string) []problem {
	var out []problem
	p := joinLines(content, 1)
	for _, off := range wrongNamespaceProse(p.text) {
		out = append(out, problem{file, p.lineAt(off), excerpt(p.text, off)})
	}
	for i, line := range strings.Split(content, "\n") {
		if wrongKubectl(line) {
			out = append(out, problem{file, i + 1, strings.TrimSpace(line)})
		}
	}
	if strings.HasSuffix(file, ".yaml") || strings.HasSuffix(file, ".yml") || strings.HasSuffix(file, ".md") {
		out = append(out, checkManifests(file, content)...)
	}
	return out
}

// checkManifests finds BuildEnvironments and BuildJobs given the operator's namespace in a
// YAML file (or a Markdown file's YAML), one document at a time.
func checkManifests(file, content string) []problem {
	var out []problem
	line := 1
	for _, doc := range regexp.MustCompile(`(?m)^(?:---|`+"```"+`).*$`).Split(content, -1) {
		if manifestKind.MatchString(doc) {
			for _, m := range manifestNamespace.FindAllStringIndex(doc, -1) {
				out = append(out, problem{file, line + strings.Count(doc[:m[0]], "\n"), strings.TrimSpace(doc[m[0]:m[1]])})
			}
		}
		line += strings.Count(doc, "\n")
	}
	return out
}

// excerpt is the text around off, for the failure message.
func excerpt(text string, off int) string {
	from, to := max(0, off-60), min(len(text), off+60)
	for from > 0 && !strings.HasPrefix(text[from:], " ") {
		from--
	}
	return "…" + strings.TrimSpace(text[from:to]) + "…"
}

// checkGo returns the problems in the string literals of a Go file: each literal, or each
// chain of literals joined with +, is read as the user reads the message it makes.
func checkGo(file string, src []byte) ([]problem, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []problem
	check := func(parts []literal) {
		var p prose
		for _, part := range parts {
			lp := joinLines(part.s, fset.Position(part.pos).Line)
			for i := range lp.starts {
				p.starts = append(p.starts, len(p.text)+lp.starts[i])
				p.lines = append(p.lines, lp.lines[i])
			}
			p.text += lp.text
			for i, l := range strings.Split(part.s, "\n") {
				if wrongKubectl(l) {
					out = append(out, problem{file, fset.Position(part.pos).Line + i, strings.TrimSpace(l)})
				}
			}
		}
		if len(p.starts) == 0 {
			return
		}
		for _, off := range wrongNamespaceProse(p.text) {
			out = append(out, problem{file, p.lineAt(off), excerpt(p.text, off)})
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr, *ast.BasicLit:
			if parts, ok := literalChain(n.(ast.Expr)); ok {
				check(parts)
				return false
			}
		}
		return true
	})
	return out, nil
}

// literal is one string literal of a chain, and where it is.
type literal struct {
	pos token.Pos
	s   string
}

// literalChain is the string literals of e, when e is a literal or a chain of them joined
// with +.
func literalChain(e ast.Expr) ([]literal, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return nil, false
		}
		s, err := strconv.Unquote(e.Value)
		return []literal{{e.Pos(), s}}, err == nil
	case *ast.ParenExpr:
		return literalChain(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return nil, false
		}
		l, ok := literalChain(e.X)
		if !ok {
			return nil, false
		}
		r, ok := literalChain(e.Y)
		return append(l, r...), ok
	}
	return nil, false
}

// userText lists the files a user reads, relative to root: the docs, the READMEs, the
// plugin's definition and hook, the examples.
func userText(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "plugin.yml", "plugin/README.md"}
	for _, dir := range []string{"docs", "hooks", "examples"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			// Go files are checked as Go (their string literals), below.
			if strings.HasSuffix(path, ".go") {
				return nil
			}
			rel, err := filepath.Rel(root, path)
			files = append(files, rel)
			return err
		})
		require.NoError(t, err)
	}
	return files
}

// goSources lists the module's Go files but its tests, relative to root. Test files are
// left out: their assertions speak of the operator's namespace where it is meant.
func goSources(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".cache", "bin", "testdata", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			rel, err := filepath.Rel(root, path)
			files = append(files, rel)
			return err
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// TestNamespacesNamedRight: no doc, example, plugin text, hook or Go message places
// BuildEnvironments, BuildJobs or job pods in the operator's namespace.
func TestNamespacesNamedRight(t *testing.T) {
	var problems []string
	texts := userText(t, repoRoot)
	require.Contains(t, texts, filepath.Join("hooks", "environment"), "the plugin's hook is checked")
	for _, f := range texts {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		for _, p := range checkText(f, string(b)) {
			problems = append(problems, p.String())
		}
	}
	sources := goSources(t, repoRoot)
	require.Contains(t, sources, filepath.Join("pkg", "plugin", "validate.go"), "the plugin's messages are checked")
	for _, f := range sources {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		ps, err := checkGo(f, b)
		require.NoError(t, err)
		for _, p := range ps {
			problems = append(problems, p.String())
		}
	}
	if len(problems) > 0 {
		t.Errorf("these place BuildEnvironments, BuildJobs or job pods in the operator's namespace (`buildkite` by default), "+
			"where the operator keeps only its own Secrets and Lease; they live in the job namespace (`buildkite-jobs` by default): say so\n%s",
			strings.Join(problems, "\n"))
	}
}

// TestNamespaceCheckFinds: the check finds what it is for, in each kind of text, and leaves
// the operator's namespace alone where it is meant.
func TestNamespaceCheckFinds(t *testing.T) {
	wrong := map[string]string{
		"hook message":  `problems+=("give the name of a BuildEnvironment in the operator's namespace (lowercase letters)")`,
		"plugin.yml":    "description: Name of the BuildEnvironment, in the operator's namespace, the job runs in.",
		"wrapped":       "# Needs the PersistentVolumeClaim git-mirrors (ReadWriteMany) in the operator's\n# namespace.",
		"live":          "BuildJobs and job pods live in the operator namespace.",
		"named":         "Create the BuildEnvironment in the `buildkite` namespace.",
		"of":            "The namespace of the operator holds the BuildEnvironments.",
		"kubectl":       "| a job fails | `kubectl -n buildkite describe buildjob <job uuid>` has the events |",
		"kubectl long":  "kubectl get benv --namespace=buildkite",
		"manifest":      "apiVersion: buildkite-operator.dev/v1alpha1\nkind: BuildEnvironment\nmetadata:\n  name: x\n  namespace: buildkite\n",
		"token secrets": "The job token Secrets are in the operator's namespace.",
	}
	for name, text := range wrong {
		assert.NotEmpty(t, checkText("x.md", text), "%s: not found in %q", name, text)
	}
	ps := checkText("x.yaml", "kind: BuildJob\n---\n# an environment\nkind: BuildEnvironment\nmetadata:\n  name: x\n  namespace: buildkite\n")
	require.Len(t, ps, 1, "a manifest in the operator's namespace")
	assert.Equal(t, 7, ps[0].line, "the line of its namespace")
	right := map[string]string{
		"own secrets": "The operator's own Secrets (registration token, slot state) live in the operator's namespace; " +
			"BuildJobs and job pods in the job namespace.",
		"negated":      "A BuildEnvironment in the job namespace (`buildkite-jobs`, not the operator's namespace).",
		"job ns":       "Name of the BuildEnvironment, in the operator's job namespace, the job runs in.",
		"kubectl jobs": "kubectl -n buildkite-jobs get buildenvironments",
		"kubectl op":   "kubectl -n buildkite logs deploy/buildkite-operator",
		"paragraphs":   "Its slot Secrets are in the operator's namespace\n\nBuildJobs are elsewhere.",
		"manifest":     "kind: BuildEnvironment\nmetadata:\n  name: x\n  namespace: buildkite-jobs\n",
	}
	for name, text := range right {
		assert.Empty(t, checkText("x.yaml", text), "%s: wrongly found in %q", name, text)
	}

	src := "package x\n\nimport \"fmt\"\n\nvar err = fmt.Errorf(\"%q is not a valid BuildEnvironment name: give the name of a BuildEnvironment \"+\n" +
		"\t\"in the operator's namespace, such as go-1-26\", name)\n"
	ps, err := checkGo("x.go", []byte(src))
	require.NoError(t, err)
	require.Len(t, ps, 1, "a message split over concatenated literals is read whole")
	assert.Equal(t, 6, ps[0].line, "the line of the phrase")
	ps, err = checkGo("x.go", []byte("package x\n\n// A BuildEnvironment in the operator's namespace, in a comment.\nvar s = \"BuildJobs\"\n"))
	require.NoError(t, err)
	assert.Empty(t, ps, "comments are not messages")
}
