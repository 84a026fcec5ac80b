package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// envJobTimeoutFile names the marker file that the agent (v3.138.1 on) writes before it
// signals a job it stops for a timeout; bootstrap sets BUILDKITE_JOB_TIMED_OUT=true for the
// post-command hook when it finds the file on its cancel.
const envJobTimeoutFile = "BUILDKITE_AGENT_JOB_TIMEOUT_FILE"

// timedOut stops the job because its own timeout (Config.Timeout) has passed: as a cancel
// does (SIGTERM, the grace period, SIGKILL), with a line in the log that says which timeout
// it was. The job then ends with exit status -1 and the signal reason of a stopped job
// (see result).
func (j *job) timedOut() {
	j.logf("the job's timeout of %s has passed: stopping its command", j.conf.Timeout)
	j.stop(agentapi.SignalReasonCancel, ownTimeout, "# "+timeoutNotice(j.conf.Timeout, j.conf.TimeoutSource))
}

// timedOutOnBuildkite stops the job because Buildkite says it timed out (the step's own
// timeout_in_minutes): a cancel, and the marker for bootstrap, as the agent does.
func (j *job) timedOutOnBuildkite() {
	j.stop(agentapi.SignalReasonCancel, buildkiteTimeout, "# The job timed out on Buildkite")
}

// timeoutKind says whether, and by whose timeout, a job is stopped.
type timeoutKind int

const (
	notTimedOut timeoutKind = iota
	// buildkiteTimeout: Buildkite timed the job out (the step's timeout_in_minutes); it
	// shows the job as timed out, so the command's exit status is reported as it is.
	buildkiteTimeout
	// ownTimeout: the job's timeout from its plugin options or its BuildEnvironment,
	// which only the supervisor enforces.
	ownTimeout
)

// markTimedOut writes the timeout marker for bootstrap, when the job's env names one.
// Called with mu held, before the signal.
func (j *job) markTimedOut() {
	path := j.timeoutFile
	if path == "" {
		return
	}
	if err := os.WriteFile(path, []byte("true"), 0o644); err != nil {
		// The cancel goes on: the post-command hook only misses BUILDKITE_JOB_TIMED_OUT.
		j.logf("writing the job's timeout marker %s: %v", path, err)
		return
	}
	j.timeoutMarked = true
}

// removeTimeoutMark removes the timeout marker once the job has ended, as the agent does: a
// stale one would tell the next job of a reused workspace that it timed out. Only a marker
// the supervisor wrote: the path may come from the step's env, and must not make the
// supervisor remove a file of the job's.
func (j *job) removeTimeoutMark() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.timeoutMarked {
		if err := os.Remove(j.timeoutFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			j.logf("removing the job's timeout marker %s: %v", j.timeoutFile, err)
		}
	}
}

// timeoutNotice says, for the pipeline author, which timeout stopped the job.
func timeoutNotice(d time.Duration, source string) string {
	switch source {
	case podcontract.TimeoutSourceStep:
		return fmt.Sprintf("The job ran past its timeout of %s, set by the step (the buildkite-operator plugin's timeout_in_minutes, or BK_OPERATOR_TIMEOUT_IN_MINUTES)", minutes(d))
	case podcontract.TimeoutSourceEnvironment:
		return fmt.Sprintf("The job ran past its timeout of %s, its BuildEnvironment's default (spec.timeouts.defaultMinutes; a step may choose another with the buildkite-operator plugin's timeout_in_minutes)", minutes(d))
	default:
		return fmt.Sprintf("The job ran past its timeout of %s", minutes(d))
	}
}

// minutes shows a timeout as the minutes it was given in ("30 minutes"), or as a duration
// when it is not a whole number of them.
func minutes(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "1 minute"
	case d > 0 && d%time.Minute == 0:
		return fmt.Sprintf("%d minutes", d/time.Minute)
	default:
		return d.String()
	}
}
