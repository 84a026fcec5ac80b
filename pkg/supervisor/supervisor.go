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
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/logstream"
	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
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
	state, startedAt, over, err := begin(ctx, client, conf.JobID, logf)
	switch {
	case over:
		return endedOnBuildkite(rec, logf, state)
	case err != nil:
		return fail(err)
	}
	rec.update(func(p *jobprogress.Progress) { p.Started = true })

	redactor, redactNotes := redactorFor(conf)
	stream, err := openLog(conf, client, redactor, rec, logf)
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
	stats, closeErr := flushLog(stream, rec, logf)
	res.Log = stats
	if err := finishOnBuildkite(client, conf, res, closeErr == nil, rec, logf); err != nil {
		return res, err
	}
	return res, errors.Join(closeErr, j.err)
}

// begin tells Buildkite that the job starts, and returns when it did: the job's timeout
// counts from then. state is the job's state as the start was sent (it may be stopping
// already: a job started once, then canceled, before this supervisor ran it). Buildkite
// refuses to start a job that is over (one canceled while its pod was starting, which the
// controller may have finished already): its command must not run, and begin reports over,
// with state saying how it ended when known.
//
// The state is asked beside the start, not before it, so that a job's command waits for
// one round trip to Buildkite, not two.
func begin(ctx context.Context, client *agentapi.Client, jobID string, logf func(string, ...any)) (state agentapi.JobState, startedAt time.Time, over bool, err error) {
	type answer struct {
		state agentapi.JobState
		err   error
	}
	asked := make(chan answer, 1)
	go func() {
		s, err := client.JobState(ctx, jobID)
		asked <- answer{s, err}
	}()
	// The job's timeout counts from here, as Buildkite's own counts from the start.
	startedAt = time.Now()
	startErr := client.Start(ctx, jobID, startedAt)
	a := <-asked
	switch {
	case startErr != nil && (agentapi.IsAlreadyFinished(startErr) || agentapi.IsUnauthorized(startErr)):
		// Buildkite says the job is over; its state is for the record only.
		ended := a.state
		if a.err != nil || !ended.Terminal() {
			ended, _ = client.JobState(ctx, jobID)
		}
		return ended, startedAt, true, nil
	case startErr != nil:
		return a.state, startedAt, false, startErr
	case a.err != nil:
		// Started: the state poll beside the command asks again.
		logf("%v", a.err)
	}
	return a.state, startedAt, false, nil
}

// openLog opens the stream that sends the job's output to Buildkite, chunk by chunk, and
// keeps the progress record up to date with what Buildkite acknowledged.
func openLog(conf Config, client *agentapi.Client, redactor *redact.Redactor, rec *recorder, logf func(string, ...any)) (*logstream.Stream, error) {
	overLimit := logLimitWarning(conf.LogMaxBytes, logf)
	return logstream.New(logstream.Config{
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
}

// flushLog sends the rest of the job's output, within flushTimeout, and records how far the
// log got and whether all of it was sent.
func flushLog(stream *logstream.Stream, rec *recorder, logf func(string, ...any)) (logstream.Stats, error) {
	closeCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	stats, closeErr := stream.Close(closeCtx)
	rec.update(func(p *jobprogress.Progress) {
		p.Sequence, p.Offset, p.FailedChunks, p.LostBytes = stats.Sequence, stats.Offset, stats.FailedChunks, stats.LostBytes
		p.Flushed = closeErr == nil
	})
	if closeErr != nil {
		logf("%v", closeErr)
	}
	return stats, closeErr
}

// finishOnBuildkite reports how the job ended, when the supervisor is the one to finish it,
// and records that it did. It returns an error only when finishing failed and nobody else
// will finish the job.
func finishOnBuildkite(client *agentapi.Client, conf Config, res Result, flushed bool, rec *recorder, logf func(string, ...any)) error {
	// In a pod (FinishFlushed) the job is finished here only once all its output is sent,
	// and only when the supervisor knows why it ended; otherwise the controller finishes
	// it, after an explanation in the log.
	if !conf.Finish && !(conf.FinishFlushed && flushed && explains(res)) {
		return nil
	}
	finishCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	err := client.Finish(finishCtx, conf.JobID, agentapi.Finish{
		ExitStatus:        res.ExitStatus,
		Signal:            res.Signal,
		SignalReason:      res.SignalReason,
		ChunksFailedCount: res.Log.FailedChunks,
	})
	switch {
	case err == nil:
		rec.update(func(p *jobprogress.Progress) { p.Finished = true })
	case agentapi.IsAlreadyFinished(err):
	case conf.FinishFlushed && !conf.Finish:
		// The controller finishes the job: not an error of the job's.
		logf("finishing the job on Buildkite failed (%v); the operator finishes it", err)
	default:
		return err
	}
	return nil
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
