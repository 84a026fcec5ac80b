// Package supervisor runs one Buildkite job inside its pod: it starts the job, runs its command
// (or `buildkite-agent bootstrap`), streams the output straight to Buildkite with the job
// token, watches the job state for cancellation, and keeps its progress in the container's
// termination message so that the controller can finish the job even if the container dies.
//
// In a pod (Config.FinishFlushed) it finishes the job itself once the command has ended and
// all its output is sent, and records that it did; the controller finishes a job the
// supervisor could not, once the pod has ended (see docs/architecture.md). Config.Finish
// finishes it whatever happened to the output (standalone use).
//
// The pod of a BuildJob made by hand has no job token and runs the supervisor locally
// (Config.Local, podcontract.EnvLocal): the command runs as it would for Buildkite, its
// output goes to stdout, and nothing is started, streamed or finished on Buildkite (see
// runLocal).
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/logstream"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// logUploaders is how many log chunks may be on their way to Buildkite at once: with two, a
// chunk's compression overlaps the round trip of the one before (BenchmarkSupervisorStream:
// 11.6-17 MB/s against 5.3-11.8 with one, on the loaded development machine), and the
// progress record is behind Buildkite by two chunks at most.
const logUploaders = 2

// flushTimeout bounds sending the rest of the log once the command has ended. In a pod the
// kubelet's grace period usually ends things sooner.
const flushTimeout = 10 * time.Minute

// Result is how the job ended.
type Result struct {
	// ExitStatus for Buildkite: the command's exit status, -1 when a signal killed it or it
	// never ran.
	ExitStatus   int
	Signal       string
	SignalReason string
	// ExitCode is what the supervisor exits with, so that the container's exit code is the
	// command's (128+n when signal n killed it).
	ExitCode int
	// Log says how far the log got.
	Log logstream.Stats
}

// Run runs the job described by conf. When ctx ends (the supervisor got SIGTERM), the command
// is stopped as on a cancel, with the reason agent_stop, and its output is still sent. logw
// receives the supervisor's own diagnostics (never the token).
func Run(ctx context.Context, conf Config, logw io.Writer) (Result, error) {
	logf := func(format string, args ...any) { _, _ = fmt.Fprintf(logw, "agentd supervise: "+format+"\n", args...) }
	rec := &recorder{path: conf.ProgressPath, logf: logf}
	defer rec.close()
	fail := func(err error) (Result, error) {
		rec.failed(err)
		return Result{ExitStatus: -1, ExitCode: 1}, err
	}
	if err := conf.validate(); err != nil {
		return fail(fmt.Errorf("the job container's environment is incomplete: %w", err))
	}
	if conf.UserAgent == "" {
		conf.UserAgent = "buildkite-operator-supervisor"
	}
	if conf.Reap {
		startReaper(logf)
	}
	if conf.Local {
		return runLocal(ctx, conf, rec, logf)
	}
	client := agentapi.New(agentapi.Config{
		Endpoint:  conf.Endpoint,
		Token:     conf.Token,
		UserAgent: conf.UserAgent,
		WaitScale: conf.RetryWaitScale,
		Logf:      logf,
	})
	// A job canceled while its pod was starting may be over on Buildkite already (the
	// controller finishes such a job): it must not be started, nor its command run.
	state, err := client.JobState(ctx, conf.JobID)
	switch {
	case err == nil && state.Terminal(), agentapi.IsUnauthorized(err):
		return endedOnBuildkite(rec, logf, state)
	case err != nil:
		// Start tells, below.
		logf("%v", err)
	}
	// The job's timeout counts from here, as Buildkite's own counts from the start.
	startedAt := time.Now()
	if err := client.Start(ctx, conf.JobID, startedAt); err != nil {
		if agentapi.IsAlreadyFinished(err) || agentapi.IsUnauthorized(err) {
			// Buildkite says the job is over; its state is for the record only.
			state, _ := client.JobState(ctx, conf.JobID)
			return endedOnBuildkite(rec, logf, state)
		}
		return fail(err)
	}
	rec.update(func(p *jobprogress.Progress) { p.Started = true })

	redactor, redactNotes := redactorFor(conf)
	overLimit := logLimitWarning(conf.LogMaxBytes, logf)
	stream, err := logstream.New(logstream.Config{
		Redactor:      redactor,
		Uploaders:     logUploaders,
		MaxChunkBytes: conf.ChunkMaxBytes,
		Interval:      conf.ChunkInterval,
		Upload: func(ctx context.Context, seq, off uint64, data []byte) error {
			overLimit(off)
			return client.UploadChunk(ctx, conf.JobID, seq, off, data)
		},
		OnChunk: func(st logstream.Stats, err error) {
			if err != nil {
				logf("log chunk %d (ending at offset %d) is lost: %v", st.Sequence, st.Offset, err)
			}
			rec.update(func(p *jobprogress.Progress) {
				p.Sequence, p.Offset, p.FailedChunks, p.LostBytes = st.Sequence, st.Offset, st.FailedChunks, st.LostBytes
			})
		},
		ResumeHeading: "~~~ Command output (continued)",
	})
	if err != nil {
		return fail(err)
	}

	j := &job{conf: conf, stream: stream, logf: logf, notes: redactNotes, startedAt: startedAt}
	j.printIntakeLog()
	if state.Stopped() {
		// Canceled or timing out, and waiting for the job to end: nothing runs.
		j.terminate(agentapi.SignalReasonCancel, "# The job was canceled on Buildkite before its command started")
	}
	res := j.execute(ctx, rec, func(ctx context.Context) { j.pollState(ctx, client) })
	closeCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	stats, closeErr := stream.Close(closeCtx)
	res.Log = stats
	rec.update(func(p *jobprogress.Progress) {
		p.Sequence, p.Offset, p.FailedChunks, p.LostBytes = stats.Sequence, stats.Offset, stats.FailedChunks, stats.LostBytes
		p.Flushed = closeErr == nil
	})
	if closeErr != nil {
		logf("%v", closeErr)
	}

	// In a pod (FinishFlushed) the job is finished here only once all its output is sent,
	// and only when the supervisor knows why it ended; otherwise the controller finishes
	// it, after an explanation in the log.
	if conf.Finish || (conf.FinishFlushed && closeErr == nil && explains(res)) {
		finishCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		defer cancel()
		err := client.Finish(finishCtx, conf.JobID, agentapi.Finish{
			ExitStatus:        res.ExitStatus,
			Signal:            res.Signal,
			SignalReason:      res.SignalReason,
			ChunksFailedCount: stats.FailedChunks,
		})
		switch {
		case err == nil:
			rec.update(func(p *jobprogress.Progress) { p.Finished = true })
		case agentapi.IsAlreadyFinished(err):
		case conf.FinishFlushed && !conf.Finish:
			// The controller finishes the job: not an error of the job's.
			logf("finishing the job on Buildkite failed (%v); the operator finishes it", err)
		default:
			return res, err
		}
	}
	return res, errors.Join(closeErr, j.err)
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

// explains tells whether the supervisor knows the whole of why the command ended: it exited,
// or was stopped by a cancel from Buildkite. A command killed by a signal the supervisor did
// not send (SIGKILL from the kernel's OOM killer), or stopped because the pod is being deleted
// (agent_stop), ended for a cause only Kubernetes knows: the controller writes it into the log
// and then finishes the job, which Buildkite would refuse once finished.
func explains(res Result) bool {
	switch {
	case res.SignalReason == agentapi.SignalReasonAgentStop:
		return false
	case res.Signal != "" && res.SignalReason == "":
		return false
	}
	return true
}

// endedOnBuildkite records that Buildkite had ended the job before the supervisor could
// start it (state, when known, says how): nothing ran, and nothing is to be reported, so
// the supervisor exits quietly.
func endedOnBuildkite(rec *recorder, logf func(string, ...any), state agentapi.JobState) (Result, error) {
	logf("the job is already over on Buildkite (state %q): nothing to run", state)
	rec.update(func(p *jobprogress.Progress) { p.EndedOnBuildkite, p.BuildkiteState = true, string(state) })
	return Result{ExitStatus: -1}, nil
}

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

// terminate stops the job: SIGTERM to the running step's process group, then SIGKILL after
// the grace period. Steps not started yet never start. Only the first call counts.
func (j *job) terminate(reason, notice string) {
	j.stop(reason, notTimedOut, notice)
}

// stop is terminate, for a timeout of either kind too.
func (j *job) stop(reason string, t timeoutKind, notice string) {
	if !j.signalTerm(reason, t) {
		return
	}
	// After the signal, not before: sending the log may be slow, and the signal must not wait.
	_ = j.stream.WriteLine(fmt.Sprintf("%s: sent SIGTERM to the command; SIGKILL follows if it is still running %s later", notice, j.conf.SignalGrace))
}

// signalTerm sends SIGTERM and arms the SIGKILL; it reports false when the job was already
// being stopped.
func (j *job) signalTerm(reason string, t timeoutKind) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.reason != "" || j.ended {
		return false
	}
	j.reason, j.timeout, j.stopped = reason, t == ownTimeout, time.Now()
	if t != notTimedOut {
		// Before the signal, as the agent writes it: bootstrap (v3.138.1 on) tells the
		// post-command hook that the job timed out (BUILDKITE_JOB_TIMED_OUT) when it finds
		// this file on its cancel.
		j.markTimedOut()
	}
	grace := j.conf.SignalGrace
	if j.cur != nil {
		if err := j.cur.signal(syscall.SIGTERM); err != nil {
			j.logf("sending SIGTERM to the command: %v", err)
		}
	}
	killed := make(chan struct{})
	j.killed = killed
	j.killTime = time.AfterFunc(grace, func() {
		defer close(killed)
		j.mu.Lock()
		defer j.mu.Unlock()
		// Whatever is left in the group goes, even when its leader already exited.
		if j.cur != nil {
			if err := j.cur.signal(syscall.SIGKILL); err != nil {
				j.logf("sending SIGKILL to the command: %v", err)
			}
		}
	})
	return true
}

// pollState watches the job's state on Buildkite, as the agent does, until ctx ends: a
// cancel, a timeout or a revoked token stops the command.
func (j *job) pollState(ctx context.Context, client *agentapi.Client) {
	interval := j.conf.JobStatusInterval
	if interval <= 0 {
		interval = DefaultJobStatusInterval
	}
	for {
		// Jitter keeps many jobs from polling in step.
		wait := interval + time.Duration(rand.Int64N(int64(interval)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		state, err := client.JobState(ctx, j.conf.JobID)
		switch {
		case ctx.Err() != nil:
			return
		case agentapi.IsUnauthorized(err):
			j.terminate(agentapi.SignalReasonCancel, "# Buildkite no longer accepts this job's token (the job was canceled or reassigned)")
			return
		case err != nil:
			j.logf("%v", err)
		case state.Canceled():
			j.terminate(agentapi.SignalReasonCancel, "# The job was canceled on Buildkite")
			return
		case state.TimedOut():
			// Buildkite finishes a timed-out job as timed out whatever its exit status, so
			// the command's own is reported, as on a cancel.
			j.timedOutOnBuildkite()
			return
		}
	}
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
