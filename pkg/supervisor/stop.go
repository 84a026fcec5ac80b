package supervisor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

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
