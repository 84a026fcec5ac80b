// Package shape checks the shape of the code that ships (issue 26): small files and
// functions, the kubelet's reasons spelled in pkg/podstate only, and a pkg/ that depends on
// nothing else of the repository. Product code is every non-test Go file under cmd/, pkg/
// and image/; tests/, examples/, testdata and _test.go files are not product.
package shape

import (
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// loadProduct parses every product file of the repository.
func loadProduct(t *testing.T) []sourceFile {
	t.Helper()
	root := os.DirFS(testkit.RepoRoot())
	names, err := productFiles(root)
	require.NoError(t, err)
	// A walk that finds nothing would make every check pass: make sure it found the
	// files each check is about.
	for _, want := range []string{"cmd/agentd/main.go", "pkg/podstate/reasons.go", "image/image.go"} {
		require.Contains(t, names, want, "the product file list misses a file it must have: productFiles is broken")
	}
	fset := token.NewFileSet()
	files := make([]sourceFile, 0, len(names))
	for _, name := range names {
		src, err := fs.ReadFile(root, name)
		require.NoError(t, err)
		s, err := parseSource(fset, name, src)
		require.NoError(t, err)
		files = append(files, s)
	}
	return files
}

// TestProductShape runs each check over the product code and reports every finding at
// file:line, with what to do about it.
func TestProductShape(t *testing.T) {
	files := loadProduct(t)
	t.Logf("checked %d product files", len(files))
	checks := []struct {
		name  string
		check func(sourceFile) []finding
	}{
		{"files and functions are small", func(s sourceFile) []finding {
			v, _ := checkSize(s)
			return v
		}},
		{"kubelet reasons are spelled in pkg/podstate", checkReasons},
		{"pkg imports nothing outside pkg", checkImports},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			for _, s := range files {
				for _, f := range c.check(s) {
					t.Error(f)
				}
			}
		})
	}
}

// TestTableOnlyFunctions lists the functions over the limit that a table-only marker
// accepts, so that a reviewer sees each one and its reason.
func TestTableOnlyFunctions(t *testing.T) {
	var accepted []finding
	for _, s := range loadProduct(t) {
		_, a := checkSize(s)
		accepted = append(accepted, a...)
	}
	for _, a := range accepted {
		t.Log("accepted:", a)
	}
	t.Logf("%d functions over %d lines accepted as table-only", len(accepted), maxFuncLines)
}

// The product files are the non-test Go files of cmd/, pkg/ and image/, wherever the go
// command would build them.
func TestProductFiles(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{
		"cmd/a/main.go", "cmd/a/main_test.go",
		"pkg/b/b.go", "pkg/b/testdata/fixture.go", "pkg/b/_old/old.go", "pkg/b/.hidden/h.go",
		"image/cmd/release/main.go", "image/image_test.go",
		"tests/t/t.go", "examples/e/e.go", "plugin/p.go", "root.go", "pkg/b/notes.txt",
	} {
		full := filepath.Join(dir, filepath.FromSlash(p))
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte("package x\n"), 0o644))
	}
	got, err := productFiles(os.DirFS(dir))
	require.NoError(t, err)
	slices.Sort(got)
	require.Equal(t, []string{"cmd/a/main.go", "image/cmd/release/main.go", "pkg/b/b.go"}, got)
}
