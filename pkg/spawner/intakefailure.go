package spawner

import (
	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
)

// intakeError is why a job cannot become a BuildJob, for the job's Buildkite log.
type intakeError struct {
	// reason labels the failure in the intake failures metric.
	reason IntakeFailure
	// msg says what was wrong and how to fix it.
	msg string
}

func (e *intakeError) Error() string { return e.msg }

// IntakeFailure is the kind of a job the spawner failed itself: the value of the reason
// label of the intake failures metric (buildkite_operator_spawner_intake_failures_total).
// It is not a BuildJob condition reason: such a job has no BuildJob (never had one, or
// lost it).
type IntakeFailure string

// The values of the intake failures metric's reason label. The first three, and
// IntakeNotAllowed, are the operator's policy refusing the job, as an agent refuses one (its
// allowlists): the job finishes with signal reason agent_refused; IntakeSignatureRejected
// with signature_rejected, as an agent refuses a job it cannot verify. The others are
// failures of the operator's own, or the job's details lost: stack_error, except a job whose
// token Secret was deleted (agent_stop). IntakeFailure.signalReason says which.
const (
	// IntakeInvalidOptions: the step's buildkite-operator options are invalid.
	IntakeInvalidOptions IntakeFailure = "invalid_options"
	// IntakeInvalidBuildJob: the job's BuildJob would fail the admission checks (an
	// environment that does not exist, or that the pipeline may not use, ...).
	IntakeInvalidBuildJob IntakeFailure = "invalid_buildjob"
	// IntakeRejected: the API server refused the job's BuildJob or token Secret.
	IntakeRejected IntakeFailure = "rejected"
	// IntakeInvalidJob: Buildkite sent a job the operator cannot read.
	IntakeInvalidJob IntakeFailure = "invalid_job"
	// IntakeAPIUnavailable: the API server could not be reached within the create timeout.
	IntakeAPIUnavailable IntakeFailure = "api_unavailable"
	// IntakeBuildJobGone: the job's BuildJob was deleted before its end was reported.
	IntakeBuildJobGone IntakeFailure = "buildjob_gone"
	// IntakeTokenSecretMissing: the job's token Secret was deleted, so the controller let
	// the BuildJob go without telling Buildkite how the job ended (its Reported condition
	// is False with reason TokenSecretMissing); the slot, which still holds the token,
	// finishes the job.
	IntakeTokenSecretMissing IntakeFailure = "token_secret_missing"
	// IntakeSignatureRejected: the job's signature could not be verified (signed
	// pipelines: missing, invalid, by an unknown key, not the step's), under
	// --verification-failure-behavior block; or the job is signed and the operator has no
	// keys to verify it with.
	IntakeSignatureRejected IntakeFailure = "signature_rejected"
	// IntakeNotAllowed: the operator's allowlists (--allowed-repositories,
	// --allowed-plugins, --allowed-environment-variables) do not allow the job.
	IntakeNotAllowed IntakeFailure = "not_allowed"
)

// refusalFailure is the intake failure of a job the policy refused.
func refusalFailure(r jobpolicy.Refusal) IntakeFailure {
	if r == jobpolicy.RefusedSignature {
		return IntakeSignatureRejected
	}
	return IntakeNotAllowed
}

// mayHaveRun: the job had a BuildJob, whose pod may have started it and sent output.
func (f IntakeFailure) mayHaveRun() bool {
	return f == IntakeBuildJobGone || f == IntakeTokenSecretMissing
}

// signalReason is the signal reason of the finish of a job failed at intake, as the agent
// gives it (agent/run_job.go), for the step's automatic retry rules to match:
//
//   - agent_refused for the operator's policy refusing the job, as the agent refuses a job
//     its allowlists or pre-bootstrap hook do not let run: the allowlists, bad options, a
//     BuildJob the checks or the API server's admission refuse;
//   - agent_stop for a job whose token Secret was deleted: the operator stopped following
//     a job that may have been running, for a reason of its own, not the job's, as an
//     agent that is stopped mid-job does. Its command was stopped or its end could not be
//     reported, so -1 with agent_stop is what a rule retrying a stopped agent's jobs
//     should match;
//   - signature_rejected for a job whose signature could not be verified (signed
//     pipelines), as the agent refuses it;
//   - stack_error for the rest, failures of the operator's own (the API server out of
//     reach, a BuildJob gone, the job's details lost), as the Kubernetes stack reports a
//     job it could not launch.
func (f IntakeFailure) signalReason() string {
	switch f {
	case IntakeInvalidOptions, IntakeInvalidBuildJob, IntakeRejected, IntakeNotAllowed:
		return agentapi.SignalReasonAgentRefused
	case IntakeSignatureRejected:
		return agentapi.SignalReasonSignatureRejected
	case IntakeTokenSecretMissing:
		return agentapi.SignalReasonAgentStop
	}
	return agentapi.SignalReasonStackError
}
