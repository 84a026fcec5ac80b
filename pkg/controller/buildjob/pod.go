package buildjob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// createPod makes the job's pod, once its environment and token are there.
func (r *Reconciler) createPod(ctx context.Context, s *scope) (*outcome, error) {
	job := s.job
	env, err := s.environment(ctx)
	if err != nil {
		return nil, err
	}
	if problem, err := r.environmentProblem(ctx, s); err != nil || problem != "" {
		if err != nil {
			return nil, err
		}
		return neverRan(bkv1.ReasonEnvironmentNotFound, problem, progressZero), nil
	}
	if e := job.Spec.AgentEndpoint; !r.opts.endpointAllowed(e) {
		// The pod would send the job token there. The webhook refuses such a BuildJob, and
		// the spawner makes none; this holds where neither looked.
		return neverRan(bkv1.ReasonInvalidPod, fmt.Sprintf(
			"The job's pod was not made: its agentEndpoint %q is neither the operator's endpoint nor one it allows (--allowed-agent-endpoints), and job tokens go nowhere else.", e), progressZero), nil
	}
	if bkv1.MadeByHand(job) {
		if o := r.handMadeProblem(job, env); o != nil {
			return o, nil
		}
	} else if _, err := s.buildkite(ctx); err != nil {
		return r.waitForTokenSecret(ctx, s, err)
	}
	if taken, err := r.takeWarmPod(ctx, s, env); err != nil || taken {
		return nil, err
	}
	pod, err := podbuilder.Build(job, env, r.opts.podOptions())
	if err != nil {
		return neverRan(bkv1.ReasonInvalidPod, "The job's pod could not be built: "+err.Error(), progressZero), nil
	}
	err = r.client.Create(ctx, pod)
	switch {
	case err == nil:
		s.remember(func(m *jobMemory) { m.created = true })
		if ws := s.memory().warmStart; ws.reason != "" {
			operator.CountJobStart(env, ws.reason)
		}
		// Recorded in the status by the reconcile the new pod's own watch event brings
		// (observe): by then the pod often runs already, and one status write says so
		// where two (created, then running) would have.
		s.requeueAfter(r.opts.JobStatePollInterval)
		return nil, nil
	case apierrors.IsAlreadyExists(err):
		return nil, r.adoptPod(ctx, s, pod)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return r.waitForQuota(ctx, s, err)
	case apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err):
		return neverRan(bkv1.ReasonPodRejected, podRejectedMessage(err, job.Namespace, env.Name), progressZero), nil
	}
	return nil, fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
}

// adoptPod takes as the job's own the pod an earlier reconcile created (pod names it),
// which the cache does not show yet (or whose status write was lost), and records it.
func (r *Reconciler) adoptPod(ctx context.Context, s *scope, pod *corev1.Pod) error {
	if err := r.apiReader.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		return fmt.Errorf("getting existing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if !metav1.IsControlledBy(pod, s.job) {
		return fmt.Errorf("pod %s/%s exists but does not belong to BuildJob %s: delete it so the job's own pod can be created", pod.Namespace, pod.Name, s.job.Name)
	}
	s.pod, s.podRead = pod, true
	left, err := r.recordPod(ctx, s)
	s.requeueAfter(r.opts.JobStatePollInterval, left)
	return err
}

// waitForTokenSecret waits for the job's token Secret, which could not be read (err).
// The spawner creates the Secret right after the BuildJob (the Secret is owned by it):
// wait for it rather than start a pod that cannot read it, but not for ever. The first
// moments of the wait need no status write: the Secret's creation brings the next
// reconcile (Setup watches the Secrets a BuildJob owns).
func (r *Reconciler) waitForTokenSecret(ctx context.Context, s *scope, err error) (*outcome, error) {
	if !errors.Is(err, errNoToken) {
		return nil, err
	}
	grace := min(tokenGrace, r.opts.TokenWaitTimeout/2)
	if age := s.now.Sub(s.job.CreationTimestamp.Time); age < grace {
		s.requeueAfter(grace - age)
		return nil, nil
	}
	why := err.Error()
	o, wait, err := r.waitBeforePod(ctx, s, bkv1.ReasonWaitingForTokenSecret, why, r.opts.TokenWaitTimeout-grace)
	switch {
	case err != nil:
		return nil, err
	case o != nil:
		// A job with this reason already waited for its token in vain: waitForToken
		// does not hold its outcome up waiting again.
		return neverRan(bkv1.ReasonTokenSecretMissing, fmt.Sprintf(
			"The job could not run: after %s its token was still not there (%s).", r.opts.TokenWaitTimeout, why), progressZero), nil
	}
	s.requeueAfter(wait)
	return nil, nil
}

// waitForQuota waits for a ResourceQuota that refused the job's pod (err): a full quota
// frees up as other jobs end, so the job waits rather than fails, for a while, noticing a
// cancel meanwhile. An idle warm pod of the namespace gives way to it (makeRoomForJob).
func (r *Reconciler) waitForQuota(ctx context.Context, s *scope, err error) (*outcome, error) {
	job := s.job
	r.event(job, nil, corev1.EventTypeWarning, "PodQuotaExceeded", "CreatePod", "Waiting for quota: %v", err)
	o, wait, werr := r.waitBeforePod(ctx, s, bkv1.ReasonWaitingForQuota, "Waiting for quota: "+err.Error(), r.opts.QuotaTimeout)
	if o != nil {
		return neverRan(bkv1.ReasonPodRejected, fmt.Sprintf(
			"Kubernetes refused to create the job's pod for %s: %s. Ask a cluster operator for more quota in namespace %q, or give the step fewer resources.",
			r.opts.QuotaTimeout, strings.TrimSuffix(err.Error(), "."), job.Namespace), progressZero), werr
	}
	if werr != nil {
		return nil, werr
	}
	r.makeRoomForJob(ctx, s)
	if werr := r.showWait(ctx, s, r.quotaWaitNotice(err)); werr != nil {
		return nil, werr
	}
	if o, werr := r.canceledBeforeStart(ctx, s); o != nil || werr != nil {
		return o, werr
	}
	s.requeueAfter(wait)
	return nil, nil
}

// tokenGrace is how long a new BuildJob waits for its token Secret before the wait is
// recorded in its status: the spawner makes the Secret a moment after the BuildJob.
const tokenGrace = 3 * time.Second

// waitBeforePod records that the job's pod cannot be created yet, for reason, and
// says when to look again (wait); a wait for one reason that has lasted timeout returns
// an outcome, whose message is the caller's to replace, and which is the wait's last.
func (r *Reconciler) waitBeforePod(ctx context.Context, s *scope, reason, message string, timeout time.Duration) (*outcome, time.Duration, error) {
	job := s.job
	var since time.Time
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		st.Phase = bkv1.PhasePending
		st.Message = message
		since = waitingSince(job, bkv1.ConditionPodCreated, metav1.ConditionFalse, reason, message, s.now)
		recordWarmStart(s, nil)
	})
	if err != nil {
		return nil, 0, err
	}
	left := since.Add(timeout).Sub(s.now)
	if left <= 0 {
		return neverRan(reason, message, progressZero), 0, nil
	}
	return nil, min(left, r.opts.JobStatePollInterval), nil
}

// recordPod brings the status up to date with what the pod shows: created, scheduled,
// running. A state is written once the pod has shown it for opts.PhaseSettle; one the pod
// passes through quicker is never written, and the outcome's write says the rest. It
// returns how long until the state the pod shows now is due (0 once written). Until then
// the pod is the record (and the watch's last sight of it, should it go: rememberGone),
// and this process remembers that it was made (jobMemory.created).
func (r *Reconciler) recordPod(ctx context.Context, s *scope) (time.Duration, error) {
	job, pod := s.job, s.pod
	if left := r.settleLeft(s); left > 0 {
		return left, nil
	}
	wasStarted := conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue)
	running := podstate.JobRunning(pod)
	scheduled := podstate.Scheduled(pod)
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		recordPodCreated(job, pod)
		recordWarmStart(s, pod)
		switch {
		case running != nil:
			st.Phase = bkv1.PhaseRunning
			st.Message = "The job's command is running."
			if st.Times.StartedAt == nil {
				t := running.StartedAt
				if t.IsZero() {
					t = *s.nowTime()
				}
				st.Times.StartedAt = &t
			}
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionTrue, bkv1.ReasonCommandRunning, "The job's container is running")
		case wasStarted || podstate.JobEnded(pod) != nil:
			// The container started, or has ended: the phase and Started only go forward
			// from here, and the outcome decides them (recordStarted).
		case scheduled:
			st.Phase = bkv1.PhaseScheduled
			st.Message = "The job's pod is on node " + pod.Spec.NodeName + "; waiting for its containers to start."
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionFalse, bkv1.ReasonPodScheduled, "The pod is scheduled; its containers are starting")
		default:
			st.Phase = bkv1.PhasePending
			st.Message = "Waiting for the job's pod to be scheduled."
			setCondition(job, bkv1.ConditionStarted, metav1.ConditionFalse, bkv1.ReasonPodPending, "The pod is waiting to be scheduled")
		}
	})
	if err != nil {
		return 0, err
	}
	// No events for the pod's creation, scheduling or start: the status's phase and
	// conditions say so, and the pod's own events (the scheduler's, the kubelet's) have the
	// detail. An event is a write to the API server per job; the operator's are kept for
	// what a person looks for (how the job ended, and what went wrong).
	recordedPod(s, wasStarted)
	return 0, nil
}

// recordPodCreated records in the status that the job's pod exists. Call it inside
// updateStatus's change.
func recordPodCreated(job *bkv1.BuildJob, pod *corev1.Pod) {
	st := &job.Status
	st.PodName = pod.Name
	if st.Times.PodCreatedAt == nil {
		t := pod.CreationTimestamp
		st.Times.PodCreatedAt = &t
	}
	setCondition(job, bkv1.ConditionPodCreated, metav1.ConditionTrue, bkv1.ReasonPodCreated, "Pod "+pod.Name+" created")
}

// recordedPod follows a status write that recorded the pod: the status says from now on
// that the pod was made, and the time to a running command is measured once, when the
// status first says the command started.
func recordedPod(s *scope, wasStarted bool) {
	job := s.job
	if !wasStarted && conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue) && job.Status.Times.StartedAt != nil {
		podRunningSeconds.Observe(job.Status.Times.StartedAt.Sub(job.CreationTimestamp.Time).Seconds())
	}
}

// settleLeft is how long until the state the pod shows (pending, scheduled, running) has
// lasted opts.PhaseSettle, by the pod's own times; 0 when it has, or the status already
// says so. The pod's times are whole seconds, cut short, so a state is written up to a
// second early, never late.
func (r *Reconciler) settleLeft(s *scope) time.Duration {
	job, pod := s.job, s.pod
	if r.opts.PhaseSettle <= 0 {
		return 0
	}
	var since metav1.Time
	switch running := podstate.JobRunning(pod); {
	case running != nil:
		if conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue) {
			return 0
		}
		since = running.StartedAt
	case conditionIs(job, bkv1.ConditionStarted, metav1.ConditionTrue) || podstate.JobEnded(pod) != nil:
		// Only the pod's record is left to write, which an outcome soon carries.
		if conditionIs(job, bkv1.ConditionPodCreated, metav1.ConditionTrue) {
			return 0
		}
		since = pod.CreationTimestamp
	case podstate.Scheduled(pod):
		if job.Status.Phase == bkv1.PhaseScheduled {
			return 0
		}
		since = metav1.NewTime(podstate.ScheduledSince(pod))
	default:
		if conditionIs(job, bkv1.ConditionPodCreated, metav1.ConditionTrue) {
			return 0
		}
		since = pod.CreationTimestamp
	}
	if since.IsZero() {
		return 0
	}
	return max(since.Add(r.opts.PhaseSettle).Sub(s.now), 0)
}
