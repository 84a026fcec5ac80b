package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"golang.org/x/mod/modfile"
)

const agentModule = "github.com/buildkite/agent/v3"

// TestAgentVersionsAgree fails when the three places that name the real agent's version
// disagree: the operator speaks the agent API through the api package of the main module's
// version, the tests check the fake Buildkite against the binary this module builds, and
// the Makefile names the binary's folder (and the image's agent) by AGENT_VERSION. Were
// they to drift, the tests would prove the fake against another agent than the one the
// operator is written for.
func TestAgentVersionsAgree(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	versions := map[string]string{
		"go.mod":                   requiredVersion(t, filepath.Join(root, "go.mod")),
		"tests/tools/agent/go.mod": requiredVersion(t, "go.mod"),
		"Makefile (AGENT_VERSION)": makefileVersion(t, filepath.Join(root, "Makefile")),
	}
	want := versions["tests/tools/agent/go.mod"]
	for where, got := range versions {
		if got != want {
			t.Errorf("%s has buildkite-agent %s, but tests/tools/agent/go.mod has %s: make them the same (all three: %v)", where, got, want, versions)
		}
	}
}

// requiredVersion is the version of the agent module that a go.mod requires, which must
// not be replaced (a replace would build or import something else than that version).
func requiredVersion(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	f, err := modfile.ParseLax(path, data, nil)
	if err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	for _, r := range f.Replace {
		if r.Old.Path == agentModule {
			t.Errorf("%s replaces %s: build and import the released module", path, agentModule)
		}
	}
	for _, r := range f.Require {
		if r.Mod.Path == agentModule {
			return r.Mod.Version
		}
	}
	t.Fatalf("%s does not require %s", path, agentModule)
	return ""
}

var agentVersionLine = regexp.MustCompile(`(?m)^AGENT_VERSION\s*\?=\s*(\S+)\s*$`)

func makefileVersion(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	m := agentVersionLine.FindAllSubmatch(data, -1)
	if len(m) != 1 {
		t.Fatalf("%s: want one line `AGENT_VERSION ?= vX.Y.Z`, found %d", path, len(m))
	}
	return string(m[0][1])
}
