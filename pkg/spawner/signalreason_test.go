package spawner

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

// Every kind of intake failure finishes its job with the signal reason the agent gives the
// same stop, for the step's automatic retry rules: the operator's policy refusing the job
// is agent_refused, a job the operator stopped following is agent_stop, and the operator's
// own failures are stack_error.
func TestIntakeFailureSignalReason(t *testing.T) {
	cases := []struct {
		failure IntakeFailure
		want    string
	}{
		{IntakeInvalidOptions, agentapi.SignalReasonAgentRefused},
		{IntakeInvalidBuildJob, agentapi.SignalReasonAgentRefused},
		{IntakeRejected, agentapi.SignalReasonAgentRefused},
		{IntakeInvalidJob, agentapi.SignalReasonStackError},
		{IntakeAPIUnavailable, agentapi.SignalReasonStackError},
		{IntakeBuildJobGone, agentapi.SignalReasonStackError},
		{IntakeTokenSecretMissing, agentapi.SignalReasonAgentStop},
		// A reason read back from an older slot's Secret that this version does not know.
		{IntakeFailure("unknown"), agentapi.SignalReasonStackError},
	}
	for _, tc := range cases {
		t.Run(string(tc.failure), func(t *testing.T) {
			assert.Equal(t, tc.want, tc.failure.signalReason())
		})
	}
}
