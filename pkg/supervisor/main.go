package supervisor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Main is agentd-supervise (cmd/agentd-supervise, what job containers run) and `agentd
// supervise`: it reads its settings from env (pkg/podcontract) and args, runs the job, and
// returns the exit code the process should exit with.
func Main(args, env []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workspace := fs.String("workspace", podcontract.WorkspaceDir, "the job's working directory and checkout")
	finish := fs.Bool("finish", false, "finish the job on Buildkite when the command ends, however its output went (standalone use)")
	finishFlushed := fs.Bool(podcontract.FinishFlushedFlag, false, "finish the job on Buildkite when the command ends and all its output is sent, and record so in the progress (in a pod: the controller finishes a job the supervisor could not)")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "usage: agentd-supervise [--workspace DIR] [--finish | --finish-flushed]\n   or: agentd supervise [--workspace DIR] [--finish | --finish-flushed]\n\n"+
			"Runs one Buildkite job: its settings come from the environment (%s, %s, %s, %s, ...).\n\n",
			podcontract.EnvEndpoint, podcontract.EnvAccessToken, podcontract.EnvJobID, podcontract.EnvCommand)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	conf, err := ConfigFromEnv(env)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "agentd supervise: %v\n", err)
		rec := &recorder{path: conf.ProgressPath, logf: func(string, ...any) {}}
		rec.failed(err)
		rec.close()
		return 1
	}
	conf.Workspace = *workspace
	conf.Finish = *finish
	conf.FinishFlushed = *finishFlushed
	conf.Reap = true
	tuneGC()

	// SIGTERM is the pod being deleted; SIGINT someone pressing Ctrl-C in standalone use.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	res, err := Run(ctx, conf, stderr)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "agentd supervise: %v\n", err)
	}
	return res.ExitCode
}

// The collector's settings for the supervisor (tuneGC). The memory limit caps the heap that
// 200% would let grow in agentd, whose other commands' packages keep several MiB live from
// their init.
const (
	gcPercent     = 200
	gcMemoryLimit = 24 << 20
)

// tuneGC makes the collector run less often than Go's default, unless GOGC or GOMEMLIMIT
// say otherwise. The agent API client allocates a new gzip writer and its buffers (over
// 1 MiB) for every log chunk, so with the default the collector ran every other chunk:
// BenchmarkSupervisorStream measured 39-46 ms of CPU per MB streamed, and 34-39 with these
// settings, for the same peak memory.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(gcMemoryLimit)
	}
}
