package buildjob

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// The pod of a job the operator accepted carries no finalizer (podbuilder.PodFinalizer is
// for BuildJobs made by hand): its supervisor tells Buildkite itself that the job started,
// and how it ended unless Kubernetes stopped it, so holding every pod until its outcome is
// read cost a write per job to guard against what is rare. Such a pod can be gone before
// the controller has read it: deleted with force, its node gone, or deleted while the
// operator was down. Buildkite's state of the job then says how far the job got: whether
// it is over, whether a command ran, or whether a pod may still be made for it.

// restartMargin: a BuildJob created before this long after this process began to lead
// may have had a pod made by an earlier process (the one before a restart, or the replica
// that led before), which may be gone without a trace. The margin is for the API server's
// clock, which stamps the BuildJob, running ahead of this node's (by far less than this
// where clocks are kept by NTP); a BuildJob within it only costs a question to Buildkite
// before its pod is made.
const restartMargin = 2 * time.Second

// mayHaveHadPod: the job's pod, not there, was made, as far as this process can tell: by
// this process (or a status that records it), or by an earlier one.
func (r *Reconciler) mayHaveHadPod(s *scope) bool {
	return s.podMade() || s.job.CreationTimestamp.Time.Before(r.started().Add(restartMargin))
}

// started is when this process began to lead (Setup adds a runnable that runs once it
// leads), or its first reconcile if that came first.
func (r *Reconciler) started() time.Time {
	r.startOnce.Do(func() { r.startedAt = time.Now() })
	return r.startedAt
}

// lostPod handles a job whose pod is not there though one may have been made
// (mayHaveHadPod). create: Buildkite has not seen the job start and no pod of this
// process's may still start it, so its pod is to be made (again). Otherwise the outcome,
// or nil to look again later (Buildkite did not answer, or a supervisor may still be
// stopping: see waitForSupervisor).
func (r *Reconciler) lostPod(ctx context.Context, s *scope) (o *outcome, create bool, err error) {
	job := s.job
	if bkv1.MadeByHand(job) {
		// Its pod is held by the finalizer: gone means removed by hand, with the finalizer.
		if s.podMade() {
			return vanished(s, conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue)), false, nil
		}
		return nil, true, nil
	}
	gone := s.memory().gone
	if _, err := s.buildkite(ctx); errors.Is(err, errNoToken) {
		if !s.podMade() && gone == nil {
			// No pod can have run without the token: createPod waits for it, or gives up.
			return nil, true, nil
		}
		// Buildkite cannot be asked without the token: the job ends as the status and the
		// pod's last sight tell, and finish waits a while for the token, or gives up on
		// telling Buildkite, as for any job.
		return goneOutcome(s, conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue)), false, nil
	}
	state, ok, err := r.jobState(ctx, s)
	if err != nil || !ok {
		s.requeueAfter(r.opts.JobStatePollInterval)
		return nil, false, err
	}
	switch {
	case state.Terminal():
		if gone != nil && podstate.JobEnded(gone) != nil {
			// The watch saw the job container end: its supervisor's record says how.
			o := fromDeletedPod(gone, false)
			o.buildkiteDone = true
			return o, false, nil
		}
		return endedWithoutPod(s, state), false, nil
	case state == agentapi.JobStateAccepted || state == agentapi.JobStateAssigned:
		if !s.podMade() && gone == nil {
			return nil, true, nil
		}
		if stop := stopping(job); stop != nil {
			// The controller deleted it to stop the job before its command started.
			return stop, false, nil
		}
		return goneOutcome(s, false), false, nil
	}
	if wait, err := r.waitForSupervisor(ctx, s); err != nil || wait > 0 {
		s.requeueAfter(wait)
		return nil, false, err
	}
	return goneOutcome(s, true), false, nil
}

// goneOutcome is the outcome of a job whose pod is gone while Buildkite still has the job
// open: from the pod as the watch last saw it with its deletion (jobMemory.gone), else
// vanished. ran: Buildkite has the job started.
func goneOutcome(s *scope, ran bool) *outcome {
	if gone := s.memory().gone; gone != nil {
		return fromDeletedPod(gone, false)
	}
	return vanished(s, ran)
}

// waitForSupervisor is how much longer to wait before finishing a started job whose pod is
// gone: a pod deleted with force leaves the API server at once while its containers are
// still being stopped, and its supervisor may still send output, which a finish would cut
// off. The kubelet stops them within the pod's grace period, so the supervisor gets that
// and lostPodMargin (at most PodTerminationTimeout) from when the pod was found gone, which
// the PodGone condition keeps: a wait that a restart began again could last for ever where
// the operator restarts often. None when the watch saw the job container end.
func (r *Reconciler) waitForSupervisor(ctx context.Context, s *scope) (time.Duration, error) {
	job, gone := s.job, s.memory().gone
	if gone != nil && podstate.JobEnded(gone) != nil {
		return 0, nil
	}
	var grace time.Duration
	if gone != nil && gone.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*gone.Spec.TerminationGracePeriodSeconds) * time.Second
	} else {
		env, err := s.environment(ctx)
		if err != nil {
			return 0, err
		}
		grace = podbuilder.GracePeriod(env, r.opts.podOptions())
	}
	wait := min(grace+lostPodMargin, r.opts.PodTerminationTimeout)
	c := condition(job, bkv1.ConditionPodGone)
	if c == nil {
		err := r.updateStatus(ctx, job, func(*bkv1.BuildJobStatus) {
			setCondition(job, bkv1.ConditionPodGone, metav1.ConditionTrue, bkv1.ReasonPodDeleted, fmt.Sprintf(
				"The job's pod %s is gone while Buildkite has its command running; the job is finished once its supervisor has had %s to stop.", lostPodName(s), wait))
		})
		return wait, err
	}
	return c.LastTransitionTime.Add(wait).Sub(s.now), nil
}

// lostPodMargin is what a supervisor stopped at the end of its pod's grace period is given
// besides, to be gone for sure: the kubelet's SIGKILL comes then, but not to the second.
const lostPodMargin = 5 * time.Second

// lostPodName is the name of the job's pod that is gone: its own, or the warm pod the
// status or this process's memory names.
func lostPodName(s *scope) string {
	switch {
	case s.job.Status.PodName != "":
		return s.job.Status.PodName
	case s.memory().warmPod.Name != "":
		return s.memory().warmPod.Name
	}
	return podbuilder.PodName(s.job)
}

// vanished is the outcome of a job whose pod went without the operator seeing how the job
// ended, most often with a node that went away: a disruption like any other, whose cause
// is unknown. ran: the job's command had started.
func vanished(s *scope, ran bool) *outcome {
	when := "before the job's command started"
	if ran {
		when = "while the job was running"
	}
	d := &disruption{bkv1.ReasonPodDeleted, fmt.Sprintf("The job's pod %s disappeared %s, without the operator seeing how it ended.", lostPodName(s), when), "SIGKILL"}
	return disrupted(d, progressZero, ran)
}

// endedWithoutPod is the outcome of a job Buildkite has ended (state) whose pod is gone
// before the operator read how it ended: its supervisor finished it, or it was canceled.
// Buildkite takes nothing more, and has the exit status in its log, which the operator
// does not know.
func endedWithoutPod(s *scope, state agentapi.JobState) *outcome {
	msg := fmt.Sprintf("The job's pod %s is gone, and Buildkite had ended the job (%s) before the operator read how: the job's log on Buildkite says how its command ended.", lostPodName(s), state)
	o := &outcome{reason: bkv1.ReasonPodDeleted, exitStatus: -1, message: msg, buildkiteDone: true}
	if state.Stopped() {
		o.reason, o.signalReason = bkv1.ReasonCanceled, agentapi.SignalReasonCancel
	}
	return o
}
