// Package e2e runs Buildkite jobs on real pods: one local node for the whole suite, the
// fake Buildkite on the node's bridge gateway, and `agentd operator` as a real process.
// It needs root and what `make test-e2e` builds, so it runs only when E2E=1.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// minute is a "minute" of timeout_in_minutes in the fake, so that a timeout is quick.
const minute = 4 * time.Second

// spawn is the operator's slots: enough for the twenty-jobs case at once, beside the
// late-node job, which holds one for most of the suite.
const spawn = 21

var (
	env      *harness.Env
	startErr error
	// repo is a git repository on the host, mounted into the pods that check it out.
	repo harness.GitRepo

	timingsMu sync.Mutex
	timings   []string
)

func TestMain(m *testing.M) {
	if os.Getenv("E2E") != "1" {
		os.Exit(m.Run()) // every test skips
	}
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	state, err := os.MkdirTemp("", "bk-operator-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// The fake logs every request: keep that in a file, shown when something fails.
	logPath := filepath.Join(state, "harness.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	var logMu sync.Mutex
	logf := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		line := fmt.Sprintf("%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
		_, _ = logFile.WriteString(line)
		if !strings.HasPrefix(format, "fake buildkite") {
			_, _ = os.Stderr.WriteString(line)
		}
	}
	if repo, err = harness.MakeRepo(filepath.Join(state, "repo")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: making the git repository:", err)
		return 1
	}
	if err := harness.GiveToPods(repo.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	// E2E_AGENTD runs another operator binary (a build of another revision, say); by
	// default the suite builds agentd from this tree. The job pods' agentd comes from the
	// operator image either way (`make images`).
	agentd := os.Getenv("E2E_AGENTD")
	if agentd == "" {
		agentd = filepath.Join(state, "agentd")
		build := exec.CommandContext(ctx, "go", "build", "-o", agentd, "./cmd/agentd")
		build.Dir = testkit.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: building agentd: %v\n%s", err, out)
			return 1
		}
	}
	env, startErr = harness.Start(ctx, harness.Options{
		StateDir:       filepath.Join(state, "node"),
		ImagesDir:      filepath.Join(testkit.RepoRoot(), ".cache", "images"),
		Agentd:         agentd,
		MinuteDuration: minute,
		Spawn:          spawn,
		// Short bounds, so that the pending-pod cases end soon after they have shown what
		// they wait for (an image that is not present with pull policy Never fails at
		// once, whatever the bound). The wait for a node keeps its default (30 minutes,
		// for autoscalers): the late-node job waits past 5 minutes, and the case of a pod
		// no node can take is bounded by its step's timeout.
		OperatorArgs: []string{"--image-pull-grace", waitBound.String(), "--quota-timeout", waitBound.String()},
		Logf:         logf,
	})
	if startErr != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting:", startErr)
	} else {
		recordTiming("node start %s; everything up %s", env.NodeStart.Round(time.Millisecond), env.Total.Round(time.Millisecond))
		if err := env.ApplyEnvironment(ctx, repoEnvironment("git", false)); err != nil {
			startErr = err
		} else if err := env.ApplyEnvironment(ctx, repoEnvironment("bootstrap-git", true)); err != nil {
			startErr = err
		} else {
			lateErr = startLateNodeJob(ctx, env)
		}
	}
	code := m.Run()
	if env != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "e2e: the operator's log (%s) ends:\n%s\n", env.Operator.LogHint(), env.Operator.Tail(60))
		}
		if err := env.Stop(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: stopping:", err)
			code = 1
		}
	}
	_ = logFile.Close()
	recordTiming("whole suite %s", time.Since(t0).Round(time.Millisecond))
	fmt.Fprintf(os.Stderr, "e2e timings:\n  %s\n", strings.Join(timings, "\n  "))
	if code == 0 {
		_ = os.RemoveAll(state)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: kept %s (the operator's and the fake's logs)\n", state)
	}
	return code
}

// needEnv skips without E2E=1 and fails when the suite's setup failed.
func needEnv(t *testing.T) *harness.Env {
	t.Helper()
	if os.Getenv("E2E") != "1" {
		t.Skip("end-to-end test on real pods: run `make test-e2e` (sets E2E=1; needs root and builds the node's binaries and images)")
	}
	if startErr != nil {
		t.Fatalf("the suite's setup failed: %v", startErr)
	}
	return env
}

func recordTiming(format string, args ...any) {
	timingsMu.Lock()
	defer timingsMu.Unlock()
	timings = append(timings, fmt.Sprintf(format, args...))
}
