package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pluginRef is a reference to the plugin at a version tag, as pipelines write it (a
// placeholder such as vX.Y.Z is not one).
var pluginRef = regexp.MustCompile(`buildkite-operator(?:\.git)?#(v[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*)`)

// latestRelease is the newest version CHANGELOG.md has an entry for, as a tag (vX.Y.Z).
var latestRelease = regexp.MustCompile(`(?m)^## \[([0-9]+\.[0-9]+\.[0-9]+[^\]]*)\]`)

// Every reference to the plugin at a tag, in the docs, examples, the project's own pipeline
// and the plugin's files, names the newest release in CHANGELOG.md: a pipeline copied from
// the docs refers to a tag that exists, of the operator the docs describe.
func TestPluginReferencesNameTheRelease(t *testing.T) {
	changelog, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	require.NoError(t, err)
	m := latestRelease.FindSubmatch(changelog)
	require.NotNil(t, m, "CHANGELOG.md has no release entry")
	want := "v" + string(m[1])

	found := 0
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != repoRoot && (strings.HasPrefix(name, ".") && name != ".buildkite" || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(name) {
		case ".md", ".yml", ".yaml", ".sh", ".bash":
		default:
			if filepath.Base(filepath.Dir(path)) != "hooks" {
				return nil
			}
		}
		if name == "CHANGELOG.md" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, ref := range pluginRef.FindAllSubmatch(b, -1) {
			found++
			assert.Equal(t, want, string(ref[1]), "%s refers to the plugin at %s, not the release %s", path, ref[0], want)
		}
		return nil
	})
	require.NoError(t, err)
	assert.NotZero(t, found, "no reference to the plugin at a tag was found: the pattern is wrong")
}
