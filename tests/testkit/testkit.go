// Package testkit finds what every kind of test shares from the checkout: the repository's
// root, the real buildkite-agent `make agent-binary` builds, and a buffer a process writes
// while a test reads it. It imports only the standard library, so that any test package,
// however low in the tree, can use it without an import cycle or a heavy build.
package testkit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// AgentVersion is the buildkite-agent release the tests run and the job and agent images
// carry: the Makefile's AGENT_VERSION, which builds it (TestAgentVersionIsTheMakefiles
// keeps the two the same).
const AgentVersion = "v3.138.1"

// RepoRoot is the repository's top folder, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// AgentBinary is where the real buildkite-agent is, whether or not it has been built:
// $BUILDKITE_AGENT_BINARY when set (the Makefile sets it), else where `make agent-binary`
// puts it, built without cgo so that the same file runs on the host, in the agent's image
// and in job images. The path is absolute, so it stays right for a command run elsewhere.
func AgentBinary() string {
	p := os.Getenv("BUILDKITE_AGENT_BINARY")
	if p == "" {
		return filepath.Join(RepoRoot(), ".cache", "buildkite-agent-"+AgentVersion+"-static", "buildkite-agent")
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// RequireAgent is AgentBinary for a test that proves something only the real agent can
// show: without it the test fails, saying how to build it.
func RequireAgent(t testing.TB) string {
	t.Helper()
	return agentOr(t, t.Fatal)
}

// AgentOrSkip is AgentBinary for a test that only adds the real agent's view to what other
// tests prove: without it the test is skipped, saying how to build it.
func AgentOrSkip(t testing.TB) string {
	t.Helper()
	return agentOr(t, t.Skip)
}

// agentOr is AgentBinary when that file is there, else it stops t with stop (t.Fatal or
// t.Skip), which does not return.
func agentOr(t testing.TB, stop func(args ...any)) string {
	t.Helper()
	p := AgentBinary()
	if _, err := os.Stat(p); err != nil {
		stop(fmt.Sprintf("the real buildkite-agent %s is missing at %s: run `make agent-binary` (about 5 minutes), or set BUILDKITE_AGENT_BINARY to one: %v", AgentVersion, p, err))
	}
	return p
}

// SyncBuffer is a bytes.Buffer that may be written (by exec's copying goroutine, say) while
// a test reads it. Its zero value is empty and ready to use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
