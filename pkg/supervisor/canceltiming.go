package supervisor

import (
	"strconv"
	"time"
)

// The agent's cancel timing, as it gives it to every job's env (JobRunner.createEnvironment),
// in the names of both generations of bootstrap:
//
//   - v3 (v3.52.0 to v3.138.1): BUILDKITE_SIGNAL_GRACE_PERIOD_SECONDS is how long bootstrap
//     gives the command between the cancel signal and SIGKILL (v3.52.0 reads only this one);
//     BUILDKITE_CANCEL_GRACE_PERIOD is the whole time a canceled job has, the agent's cleanup
//     after the SIGKILL included. Bootstrap v3.138.1 refuses to start unless the cancel grace
//     period is longer than the signal grace period.
//   - v4: BUILDKITE_CANCEL_SIGNAL_TIMEOUT, the same as the signal grace period, and
//     BUILDKITE_CANCEL_CLEANUP_TIMEOUT, the cleanup after it, as Go durations.
const (
	envCancelGracePeriod    = "BUILDKITE_CANCEL_GRACE_PERIOD"
	envSignalGracePeriod    = "BUILDKITE_SIGNAL_GRACE_PERIOD_SECONDS"
	envCancelSignalTimeout  = "BUILDKITE_CANCEL_SIGNAL_TIMEOUT"
	envCancelCleanupTimeout = "BUILDKITE_CANCEL_CLEANUP_TIMEOUT"
)

// cancelCleanup is the supervisor's time, after the SIGKILL, to send the rest of the log:
// the pod builder's margin between the signal grace period and the pod's
// terminationGracePeriodSeconds (podbuilder.DefaultSignalGraceMargin), which is also v4's
// default cancel-cleanup-timeout.
const cancelCleanup = 5 * time.Second

// withCancelTiming gives the job the supervisor's own cancel timing: bootstrap, of either
// generation, waits as long as the supervisor before it kills the command, so that the
// command gets the whole grace period from bootstrap too, and its hooks see the timing
// that applies. The supervisor's settings win over whatever the job's env says, as the
// agent's do (the agent protects these names from a step's env): only the environment's
// spec.agent.cancelGracePeriodSeconds chooses them, through podcontract.EnvSignalGrace.
func withCancelTiming(env []string, grace time.Duration) []string {
	// Whole seconds, as v3 takes them, and the same in v4's names.
	grace = max(grace.Truncate(time.Second), 0)
	seconds := int(grace / time.Second)
	return append(env,
		envSignalGracePeriod+"="+strconv.Itoa(seconds),
		envCancelGracePeriod+"="+strconv.Itoa(seconds+int(cancelCleanup/time.Second)),
		envCancelSignalTimeout+"="+grace.String(),
		envCancelCleanupTimeout+"="+cancelCleanup.String(),
	)
}
