package spawner

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// stoppedRecheck is how often a slot that Buildkite stopped looks at its Secret for a
// person letting it go (see stayStopped). A variable for tests.
var stoppedRecheck = time.Minute

// stopByBuildkite ends the slot as an agent that Buildkite told to stop ends: it takes
// no more jobs (it holds none: a slot pings only between jobs, so the job it ran is over)
// and disconnects. Where the agent process would exit, the slot stays down, and says so in
// its Secret, its log and the slots gauge, rather than register anew: Buildkite is asked
// to stop an agent to take it out of service, which a new registration a minute later
// would quietly undo. Its Secret keeps it down across restarts of the operator, until a
// person lets it go (stayStopped).
func (sl *slot) stopByBuildkite(ctx context.Context, message string) {
	sl.log.Info("Buildkite told the agent to stop: the slot disconnects and stays down; remove the annotation "+AnnotationSlotState+" from its Secret (or delete the Secret) to bring it back",
		"agent", sl.state.AgentID, "message", message, "secret", SlotSecretName(sl.s.cfg.Name, sl.index))
	// The mark is saved before the disconnect: a spawner killed in between resumes a
	// stopped slot, which lets its registration go, rather than connect it again.
	sl.state.hold(SlotStopped, message, time.Now())
	sl.save(ctx)
	sl.dropRegistration(ctx, true)
}

// stayStopped keeps a slot that Buildkite stopped down until a person lets it go: its
// Secret loses the stopped annotation, or is deleted. It looks every stoppedRecheck, and
// returns when the slot may register again, or ctx ends.
func (sl *slot) stayStopped(ctx context.Context) {
	if sl.state.registered() {
		// Stopped by an earlier spawner that was killed before it disconnected.
		sl.dropRegistration(ctx, true)
	}
	sl.stopHeartbeat()
	sl.setGauge("stopped")
	sl.s.health.stopped(sl.index, true)
	for sleep(ctx, stoppedRecheck) {
		var sec corev1.Secret
		err := sl.s.r.Get(ctx, client.ObjectKey{Namespace: sl.s.cfg.Namespace, Name: SlotSecretName(sl.s.cfg.Name, sl.index)}, &sec)
		switch {
		case apierrors.IsNotFound(err):
			sl.secret = nil
		case err != nil:
			if ctx.Err() == nil {
				sl.log.Error(err, "cannot read the stopped slot's Secret; looking again later")
			}
			continue
		case sec.Annotations[AnnotationSlotState] == SlotStopped:
			continue
		default:
			sl.secret = &sec
		}
		sl.log.Info("the stopped slot was let go of: it registers a new agent")
		sl.state.hold("", "", time.Now())
		sl.s.health.stopped(sl.index, false)
		sl.setGauge("idle")
		return
	}
}
