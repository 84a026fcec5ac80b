package supervisor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/logstream"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// job is one run of the job's steps (checkout, then the command).
type job struct {
	conf   Config
	stream *logstream.Stream
	logf   func(format string, args ...any)
	// notes are warnings about redaction for the log (Command runner; bootstrap prints its own).
	notes []string
	// startedAt is when the job started (on Buildkite, or locally): its timeout counts
	// from then.
	startedAt time.Time

	mu      sync.Mutex
	cur     *process  // the step running now (mu)
	reason  string    // set once the job is being stopped (mu)
	stopped time.Time // when reason was set (mu)
	// timeout is set when the job is being stopped because its own timeout passed (mu):
	// it then fails whatever its command exits with, as Buildkite knows nothing of it.
	timeout bool
	// ended is set once the steps have ended (mu): a cancel or a timeout that comes later
	// has nothing to stop, and must not say in the log that it did.
	ended bool
	// timeoutFile is the job's BUILDKITE_AGENT_JOB_TIMEOUT_FILE, "" when it has none, and
	// timeoutMarked tells that the supervisor wrote it (mu).
	timeoutFile   string
	timeoutMarked bool
	killTime      *time.Timer
	killed        chan struct{} // closed once killTime has fired (mu)
	err           error         // a step that could not start (mu)
}

// start starts one step unless the job is being stopped.
func (j *job) start(name string, args []string, dir string, env []string) (*process, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.reason != "" {
		return nil, nil
	}
	p, err := startProcess(name, args, dir, env, j.stream)
	if err != nil {
		return nil, err
	}
	j.cur = p
	return p, nil
}

// execute runs the job's steps, and the tailer of its log files beside them, and records
// how they ended. When ctx ends (the supervisor got SIGTERM: the pod is being deleted) the
// command is stopped with the reason agent_stop; watch, when set, runs until the steps
// have ended, and may stop them too (a cancel on Buildkite).
func (j *job) execute(ctx context.Context, rec *recorder, watch func(context.Context)) Result {
	var tailer *logstream.Tailer
	if len(j.conf.LogPaths) > 0 {
		tailer = logstream.TailFiles(j.stream, j.conf.LogPaths, min(j.conf.ChunkInterval, time.Second), j.logf)
	}
	jobCtx, stopJob := context.WithCancel(context.Background())
	var watchers sync.WaitGroup
	if watch != nil {
		watchers.Add(1)
		go func() {
			defer watchers.Done()
			watch(jobCtx)
		}()
	}
	watchers.Add(1)
	go func() {
		defer watchers.Done()
		select {
		case <-ctx.Done():
			j.terminate(agentapi.SignalReasonAgentStop, "# Kubernetes is stopping the job's pod (it is being deleted, evicted or its node shut down)")
		case <-jobCtx.Done():
		}
	}()
	var timer *time.Timer
	if j.conf.Timeout > 0 {
		// The timeout is the job's own, set by its step or its environment, which Buildkite
		// does not know of: the supervisor enforces it, as Buildkite enforces a step's
		// timeout_in_minutes, and the pod's activeDeadlineSeconds is only a backstop.
		timer = time.AfterFunc(time.Until(j.startedAt.Add(j.conf.Timeout)), j.timedOut)
	}
	res := j.run()
	j.mu.Lock()
	j.ended = true
	j.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	stopJob()
	watchers.Wait()
	rec.update(func(p *jobprogress.Progress) {
		p.Exited, p.ExitStatus, p.Signal, p.SignalReason = true, res.ExitStatus, res.Signal, res.SignalReason
	})
	if tailer != nil {
		tailer.Stop()
	}
	return res
}

// result says how the job ended, p being its last step (nil when none ran).
func (j *job) result(p *process) Result {
	if p != nil {
		p.wait()
	}
	// Read after the wait: a timeout or a cancel may come while the step runs.
	j.mu.Lock()
	reason, timeout, stopped, killTime, killed := j.reason, j.timeout, j.stopped, j.killTime, j.killed
	j.mu.Unlock()
	if killTime != nil {
		if p != nil {
			// The command may have ended on SIGTERM while something it started is still
			// stopping, or ignores SIGTERM: SIGKILL comes at the end of the grace period,
			// and nothing outlives the job.
			p.awaitGroup(killed)
		}
		killTime.Stop()
	}
	if p == nil {
		// Stopped before the step started, or the step could not start.
		return Result{ExitStatus: -1, SignalReason: reason, ExitCode: 1}
	}
	status, sig := exitOf(p.status)
	if timeout && !stopped.After(time.Unix(0, p.exitedAt.Load())) {
		// Buildkite knows nothing of this timeout: a command that exits 0 on SIGTERM must
		// not pass. -1 and the reason of a stopped job, as the agent reports a job it
		// stopped; the container keeps the command's own exit code.
		status = -1
	}
	return Result{ExitStatus: status, Signal: sig, SignalReason: reason, ExitCode: containerExitCode(p.status)}
}

// step runs one process of the job to its end, first showing display in the log as the
// agent shows the commands it runs. It returns nil when the job was stopped before the step
// could start.
func (j *job) step(display, name string, args []string, dir string, env []string) (*process, error) {
	if display != "" {
		_ = j.stream.WriteLine("$ " + display)
	}
	p, err := j.start(name, args, dir, env)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if p != nil {
		p.wait()
		// Its output has ended: what redaction held back (the start of a secret that
		// never came) goes out before the next step's.
		_ = j.stream.FlushOutput()
		if p.cutOff.Load() {
			_ = j.stream.WriteLine(fmt.Sprintf("# The command has exited, but processes it started still held its output open %s later: the job goes on without them, and what they print from now on is not in the log", p.afterExit))
		}
	}
	return p, nil
}

// run runs the job and returns how it ended.
func (j *job) run() Result {
	env, cleanup := j.runtimeEnv()
	defer cleanup()
	env = withCancelTiming(env, j.conf.SignalGrace)
	if path := lookup(env, envJobTimeoutFile); path != "" {
		j.mu.Lock()
		j.timeoutFile = path
		j.mu.Unlock()
		defer j.removeTimeoutMark()
	}
	if j.conf.Runner == podcontract.RunnerBootstrap {
		return j.runBootstrap(env)
	}
	return j.runCommand(env)
}

// startFailed reports a step that could not start at all, in the log and to the controller.
func (j *job) startFailed(err error) Result {
	_ = j.stream.WriteLine("🚨 Error: " + err.Error())
	j.mu.Lock()
	j.err = err
	j.mu.Unlock()
	return j.result(nil)
}
