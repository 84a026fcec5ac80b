package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRepoRootIsTheModule(t *testing.T) {
	gomod, err := os.ReadFile(filepath.Join(RepoRoot(), "go.mod"))
	require.NoError(t, err)
	assert.Contains(t, string(gomod), "module github.com/buildkite-operator/buildkite-operator\n")
}

// The tests run, and the images carry, the agent the Makefile builds.
func TestAgentVersionIsTheMakefiles(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join(RepoRoot(), "Makefile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^AGENT_VERSION\s*\?=\s*(\S+)\s*$`).FindSubmatch(makefile)
	require.NotNil(t, m, "the Makefile has no AGENT_VERSION")
	assert.Equal(t, string(m[1]), AgentVersion, "tests/testkit.AgentVersion and the Makefile's AGENT_VERSION differ")
}

func TestAgentBinary(t *testing.T) {
	cwd, err := os.Getwd()
	require.NoError(t, err)
	tests := []struct {
		name, env, want string
	}{
		{name: "unset: make agent-binary's output", want: filepath.Join(RepoRoot(), ".cache", "buildkite-agent-"+AgentVersion+"-static", "buildkite-agent")},
		{name: "absolute", env: "/opt/bk/buildkite-agent", want: "/opt/bk/buildkite-agent"},
		{name: "relative: made absolute, so a command run elsewhere finds it", env: "bin/buildkite-agent", want: filepath.Join(cwd, "bin", "buildkite-agent")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("BUILDKITE_AGENT_BINARY", tt.env)
			assert.Equal(t, tt.want, AgentBinary())
		})
	}
}

// recorder stands in for a test, to see what RequireAgent and AgentOrSkip do to one.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatal(args ...any) {
	r.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

// run calls find as a test would, on its own goroutine, so that Fatal and Skip can stop it.
func (r *recorder) run(find func(testing.TB) string) (got string) {
	var wg sync.WaitGroup
	wg.Go(func() { got = find(r) })
	wg.Wait()
	return got
}

func TestRequireAgentAndAgentOrSkip(t *testing.T) {
	there := filepath.Join(t.TempDir(), "buildkite-agent")
	require.NoError(t, os.WriteFile(there, []byte("#!/bin/sh\n"), 0o755))
	missing := filepath.Join(t.TempDir(), "buildkite-agent")
	tests := []struct {
		name                    string
		find                    func(testing.TB) string
		agent                   string
		wantFailed, wantSkipped bool
	}{
		{name: "RequireAgent, built", find: RequireAgent, agent: there},
		{name: "RequireAgent, missing: fails", find: RequireAgent, agent: missing, wantFailed: true},
		{name: "AgentOrSkip, built", find: AgentOrSkip, agent: there},
		{name: "AgentOrSkip, missing: skips", find: AgentOrSkip, agent: missing, wantSkipped: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("BUILDKITE_AGENT_BINARY", tt.agent)
			r := &recorder{TB: t}
			got := r.run(tt.find)
			assert.Equal(t, tt.wantFailed, r.failed != "", "failed: %q", r.failed)
			assert.Equal(t, tt.wantSkipped, r.skipped != "", "skipped: %q", r.skipped)
			if !tt.wantFailed && !tt.wantSkipped {
				assert.Equal(t, tt.agent, got)
				return
			}
			stopped := r.failed + r.skipped
			assert.Contains(t, stopped, "make agent-binary", "the message says how to build the agent")
			assert.Contains(t, stopped, missing, "the message says where the agent was looked for")
		})
	}
}

// Writers on other goroutines and a reader never race (run with -race) nor lose a write.
func TestSyncBuffer(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, strings.Repeat("x", 800), b.String())
}
