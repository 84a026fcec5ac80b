package supervisor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
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
			"Runs one Buildkite job: its settings come from the environment (%s, %s, %s, %s, ...).\n"+
			"With %s=true it runs the command without Buildkite, its output on stdout (a BuildJob made by hand).\n\n",
			podcontract.EnvEndpoint, podcontract.EnvAccessToken, podcontract.EnvJobID, podcontract.EnvCommand, podcontract.EnvLocal)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	// SIGTERM is the pod being deleted; SIGINT someone pressing Ctrl-C in standalone use.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if isWarm(env) {
		// A warm pod's job comes from the operator; from then on it runs as any other.
		var code int
		var ok bool
		if env, code, ok = receiveJob(ctx, env, stderr); !ok {
			return code
		}
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

	res, err := Run(ctx, conf, stderr)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "agentd supervise: %v\n", err)
	}
	return res.ExitCode
}
