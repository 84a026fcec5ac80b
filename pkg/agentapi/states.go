package agentapi

// JobState is a Buildkite job's state, as GET /jobs/{id} (JobState) and the fake report it.
// This is the one list of them in the operator: every component asks these methods instead
// of spelling states itself.
type JobState string

// The job states the operator acts on. Buildkite has others (scheduled, waiting, blocked, ...)
// that concern a job before an agent takes it.
const (
	JobStateAssigned  JobState = "assigned"
	JobStateAccepted  JobState = "accepted"
	JobStateRunning   JobState = "running"
	JobStateCanceling JobState = "canceling"
	JobStateTimingOut JobState = "timing_out"
	JobStateFinished  JobState = "finished"
	JobStateCanceled  JobState = "canceled"
	JobStateTimedOut  JobState = "timed_out"
	JobStateExpired   JobState = "expired"
	JobStateSkipped   JobState = "skipped"
	JobStateBroken    JobState = "broken"
)

// Terminal: Buildkite takes nothing more from the job (no start, log chunk or finish).
func (s JobState) Terminal() bool {
	switch s {
	case JobStateFinished, JobStateCanceled, JobStateTimedOut, JobStateExpired, JobStateSkipped, JobStateBroken:
		return true
	}
	return false
}

// Ending: Buildkite asked the job to stop (a cancel or a timeout) and waits for its finish.
func (s JobState) Ending() bool {
	return s == JobStateCanceling || s == JobStateTimingOut
}

// Canceled: the job was canceled on Buildkite, whether or not it has finished since.
func (s JobState) Canceled() bool {
	return s == JobStateCanceling || s == JobStateCanceled
}

// TimedOut: the job ran past its timeout_in_minutes, whether or not it has finished since.
func (s JobState) TimedOut() bool {
	return s == JobStateTimingOut || s == JobStateTimedOut
}

// Stopped: the job was canceled or timed out, the two ways Buildkite stops a job.
func (s JobState) Stopped() bool { return s.Canceled() || s.TimedOut() }

// Signal reasons, as Buildkite names them in a finish (signal_reason), with the meaning the
// agent gives them (agent/run_job.go): a step's automatic retry rules match on them, so
// each stop gets the reason an agent would give it.
const (
	// SignalReasonCancel: the job was canceled or timed out on Buildkite, or its token was
	// revoked, and its command was stopped.
	SignalReasonCancel = "cancel"
	// SignalReasonAgentStop: the agent stopped the job for a reason of its own, not the
	// job's: the supervisor was told to stop mid-job (its pod is being deleted), the job's
	// BuildJob was deleted (by hand, or by the drain before an uninstall), or the operator
	// could not follow the job to its end (its token Secret was deleted).
	SignalReasonAgentStop = "agent_stop"
	// SignalReasonAgentRefused: the agent refused to run the job, by its policy, before
	// running anything: here, options or a BuildJob that the operator's checks or the
	// API server's admission refuse (an environment the pipeline may not use, say).
	SignalReasonAgentRefused = "agent_refused"
	// SignalReasonStackError: the job never ran its command because of the infrastructure
	// (its pod could not be made or its image pulled, the API server could not be
	// reached, ...).
	SignalReasonStackError = "stack_error"
	// SignalReasonSignatureRejected: the agent refused to run the job because its signature
	// could not be verified (signed pipelines): it was missing or invalid, made with a key
	// the agent does not have, or not the signature of the job's step; or the job is signed
	// and the agent has no keys to verify it with.
	SignalReasonSignatureRejected = "signature_rejected"
)
