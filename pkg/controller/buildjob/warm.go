package buildjob

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	operator "github.com/buildkite-operator/buildkite-operator/pkg/controller"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// Events of a job's start in a warm pod, or cold beside a warm pool. EventStartedCold
// also says when a job's warm pod stopped before taking the job, which then starts cold
// (startColdIfWarmStopped).
const (
	EventWarmPodAssigned = "WarmPodAssigned"
	EventStartedCold     = "StartedCold"
)

// takeWarmPod gives the job an idle warm pod of its environment that fits it
// (podbuilder.WarmFits), instead of a pod of its own: the pod is made the job's (its
// labels, owner, finalizer and deadline: podbuilder.AssignWarm, one patch that fails if
// the pod changed since it was read, so two jobs never take one pod) and the registry is
// given the job for the pod's supervisor to fetch. It reports whether the job has its pod.
// A job that starts cold beside a pool remembers why, for its WarmStart condition
// (warmStart); one that no warm pod fits gets an event saying why too, as does one whose
// warm pod stopped before taking it (startColdIfWarmStopped).
func (r *Reconciler) takeWarmPod(ctx context.Context, s *scope, env *bkv1.BuildEnvironment) (bool, error) {
	job := s.job
	if s.memory().withdrawn.UID != "" {
		return false, nil // its warm pod stopped: it starts cold, and warmStart says so already
	}
	if r.opts.Handoff == nil || !env.Spec.HasWarmPool() || bkv1.MadeByHand(job) {
		s.remember(func(m *jobMemory) { m.warmStart = warmStart{} })
		return false, nil
	}
	candidates, err := r.idleWarmPods(ctx, env)
	if err != nil {
		return false, err
	}
	opts := r.opts.podOptions()
	var why string
	fits := false
	for _, warm := range candidates {
		ok, w := podbuilder.WarmFits(job, env, opts, warm)
		if !ok {
			why = w
			continue
		}
		fits = true
		taken, err := r.assignWarm(ctx, s, env, warm)
		if err != nil || taken {
			return taken, err
		}
	}
	start := warmStart{bkv1.ReasonNoIdleWarmPod, fmt.Sprintf("No warm pod of BuildEnvironment %s was idle, so the job starts in a pod of its own.", env.Name)}
	switch {
	case fits:
		// Every pod that fitted went to another job between the list and the patch.
		start.message = fmt.Sprintf("The idle warm pods of BuildEnvironment %s that fit the job were taken by other jobs, so it starts in a pod of its own.", env.Name)
	case why != "":
		start = warmStart{bkv1.ReasonNoWarmPodFits, fmt.Sprintf("No warm pod of BuildEnvironment %s fits the job, so it starts in a pod of its own: %s", env.Name, why)}
		r.event(job, nil, corev1.EventTypeNormal, EventStartedCold, "CreatePod", "%s", start.message)
	}
	s.remember(func(m *jobMemory) { m.warmStart = start })
	return false, nil
}

// warmStart is what a job's WarmStart condition says when it starts cold beside a warm
// pool (jobMemory.warmStart); the zero value says nothing.
type warmStart struct{ reason, message string }

// recordWarmStart records in the job's WarmStart condition how it got pod (nil when it
// has none): True for a warm pod of its environment's pool, which says so itself (its
// label), even to a restarted process; otherwise why it starts cold, as this process
// decided it (takeWarmPod, startColdIfWarmStopped), if it did. Call it inside
// updateStatus's change.
func recordWarmStart(s *scope, pod *corev1.Pod) {
	job := s.job
	if pod != nil && pod.Labels[podbuilder.LabelWarmPool] != "" && metav1.IsControlledBy(pod, job) {
		setCondition(job, bkv1.ConditionWarmStart, metav1.ConditionTrue, bkv1.ReasonWarmPodAssigned,
			fmt.Sprintf("The job started in warm pod %s of BuildEnvironment %s.", pod.Name, s.envName()))
		return
	}
	if ws := s.memory().warmStart; ws.reason != "" {
		setCondition(job, bkv1.ConditionWarmStart, metav1.ConditionFalse, ws.reason, ws.message)
	}
}

// idleWarmPods are env's warm pods that wait for a job, those already running first, then
// the oldest (they are the first to be replaced).
func (r *Reconciler) idleWarmPods(ctx context.Context, env *bkv1.BuildEnvironment) ([]*corev1.Pod, error) {
	pods, err := operator.WarmPods(ctx, r.client, env)
	if err != nil {
		return nil, err
	}
	var idle []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		owner := metav1.GetControllerOf(p)
		if owner == nil || owner.UID != env.UID || !p.DeletionTimestamp.IsZero() || podstate.WarmOver(p) {
			continue
		}
		idle = append(idle, p)
	}
	sortWarmForJobs(idle)
	return idle, nil
}

// sortWarmForJobs puts idle warm pods in the order jobs take them: those already running
// first, then the oldest (they are the first to be replaced). makeRoomForJob deletes them
// in the opposite order, so that the two rarely meet.
func sortWarmForJobs(idle []*corev1.Pod) {
	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }
	slices.SortStableFunc(idle, func(a, b *corev1.Pod) int {
		if ra, rb := running(a), running(b); ra != rb {
			if ra {
				return -1
			}
			return 1
		}
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
}

// assignWarm makes warm the job's pod and gives the registry the job for it. false
// without an error: another job took the pod first, or it went away.
func (r *Reconciler) assignWarm(ctx context.Context, s *scope, env *bkv1.BuildEnvironment, warm *corev1.Pod) (bool, error) {
	job := s.job
	hj, err := r.handoffJob(ctx, s, env)
	if err != nil {
		return false, err
	}
	pod := warm.DeepCopy()
	patch := client.MergeFromWithOptions(warm, client.MergeFromWithOptimisticLock{})
	if err := podbuilder.AssignWarm(pod, job, env, r.opts.podOptions(), s.now); err != nil {
		return false, fmt.Errorf("assigning warm pod %s/%s to BuildJob %s: %w", pod.Namespace, pod.Name, job.Name, err)
	}
	err = r.client.Patch(ctx, pod, patch)
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("assigning warm pod %s/%s to BuildJob %s: %w", pod.Namespace, pod.Name, job.Name, err)
	}
	if err := r.opts.Handoff.Assign(handoff.RefTo(pod), hj); err != nil {
		return false, fmt.Errorf("handing job %s to warm pod %s/%s: %w", job.Spec.JobID, pod.Namespace, pod.Name, err)
	}
	s.pod, s.podRead = pod, true
	// The pod's label says it is warm from here (recordWarmStart): a cold reason of an
	// earlier try (a full quota) no longer holds.
	s.remember(func(m *jobMemory) { m.created, m.warmPod, m.warmStart = true, handoff.RefTo(pod), warmStart{} })
	operator.CountJobStart(env, bkv1.ReasonWarmPodAssigned)
	r.event(job, pod, corev1.EventTypeNormal, EventWarmPodAssigned, "CreatePod", "The job starts in warm pod %s of BuildEnvironment %s", pod.Name, env.Name)
	s.requeueAfter(r.opts.JobStatePollInterval)
	return true, nil
}

// handoffJob is what the job's warm pod fetches: the job's env as its own pod's job
// container would have it, with the values the kubelet would read from the token Secret.
func (r *Reconciler) handoffJob(ctx context.Context, s *scope, env *bkv1.BuildEnvironment) (handoffclient.Job, error) {
	job := s.job
	sec := &corev1.Secret{}
	key := types.NamespacedName{Namespace: job.Namespace, Name: job.Spec.TokenSecretRef.Name}
	// From the API server: the cache keeps only the token of a token Secret, not the
	// job's env the Secret holds beside it.
	if err := r.apiReader.Get(ctx, key, sec); err != nil {
		return handoffclient.Job{}, fmt.Errorf("reading token Secret %s for the job's hand-off: %w", key, err)
	}
	vars, err := podbuilder.HandoffEnv(job, env, r.opts.podOptions(), sec)
	if err != nil {
		return handoffclient.Job{}, fmt.Errorf("the job's env for its hand-off: %w", err)
	}
	// The token goes in the hand-off's own field, which the supervisor puts where the job's
	// pod would have had it.
	token := vars[podcontract.EnvAccessToken]
	delete(vars, podcontract.EnvAccessToken)
	return handoffclient.Job{ID: job.Spec.JobID, BuildJob: job.Name, Command: job.Spec.Command, Env: vars, Token: token}, nil
}

// warmPodName finds the warm pod assigned to the job when its status does not name it yet:
// this process remembers it, or (after a restart) it carries the job's label. A warm pod
// the job was withdrawn from is never it, though the cache may still show it as the
// job's for a moment (startColdIfWarmStopped).
func (s *scope) warmPodName(ctx context.Context) (string, error) {
	m := s.memory()
	if m.warmPod.Name != "" {
		return m.warmPod.Name, nil
	}
	if s.r.opts.Handoff == nil {
		return "", nil
	}
	pods := &corev1.PodList{}
	if err := s.r.client.List(ctx, pods, client.InNamespace(s.job.Namespace),
		client.MatchingLabels{podbuilder.LabelBuildJob: validation.LabelValue(s.job.Name)}); err != nil {
		return "", fmt.Errorf("listing the pods of BuildJob %s/%s: %w", s.job.Namespace, s.job.Name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Labels[podbuilder.LabelWarmPool] != "" && p.UID != m.withdrawn.UID && metav1.IsControlledBy(p, s.job) {
			return p.Name, nil
		}
	}
	return "", nil
}

// reassignWarm gives the registry the job of the warm pod assigned to it, when it does
// not have it: the operator restarted between the assignment and the pod's fetch. A pod
// that already fetched its job has no use for it; a new process cannot tell, so the job
// is offered again, to that pod alone, and never withdrawn from it (Registry.Reoffer):
// should the pod die, the job is handled as any job pod that dies.
func (r *Reconciler) reassignWarm(ctx context.Context, s *scope) error {
	pod := s.pod
	if r.opts.Handoff == nil || pod == nil || pod.Labels[podbuilder.LabelWarmPool] == "" || podstate.Stopped(pod) {
		return nil
	}
	if st := r.opts.Handoff.State(handoff.RefTo(pod)); st == handoff.StateAssigned || st == handoff.StateHandedOff {
		return nil
	}
	env, err := s.environment(ctx)
	if err != nil || env == nil {
		return err
	}
	hj, err := r.handoffJob(ctx, s, env)
	if err != nil {
		return err
	}
	if err := r.opts.Handoff.Reoffer(handoff.RefTo(pod), hj); err != nil {
		return fmt.Errorf("handing job %s to warm pod %s/%s again: %w", s.job.Spec.JobID, pod.Namespace, pod.Name, err)
	}
	return nil
}

// startColdIfWarmStopped starts the job cold when its warm pod stopped (deleted, failed,
// evicted, lost with its node, or gone) before taking the job: a job the user could
// still run is not failed for a pod that never ran it. The registry takes the job back
// from the pod (Registry.Withdraw), under the lock the pod's claim takes, so a supervisor
// claiming the job as its pod dies either has it, and the job is handled as any job pod
// that dies (as it is when the registry cannot tell, after an operator restart), or is
// refused while the job starts elsewhere: never both, never neither.
//
// Once withdrawn, the status lets go of the pod first (so that a restart from here finds
// no pod of the job's, or the dead one by its label, as before), then the pod is let go
// of: deleted, its finalizer, the job's label and ownership taken off, so that neither
// getPod nor the pool takes it for the job's again. The reconcile then goes on with no
// pod, and createPod makes the job's own, cold (takeWarmPod passes), built afresh: none
// of the warm pod's deadline comes with it.
func (r *Reconciler) startColdIfWarmStopped(ctx context.Context, s *scope) error {
	if r.opts.Handoff == nil {
		return nil
	}
	job := s.job
	m := s.memory()
	gone := m.withdrawn
	if gone.UID == "" {
		ref, why := s.stoppedWarmPod()
		if why == "" || !r.opts.Handoff.Withdraw(ref) {
			return nil
		}
		gone = ref
		start := warmStart{bkv1.ReasonWarmPodStopped, fmt.Sprintf("Warm pod %s stopped before taking the job: %s The job starts in a pod of its own.", ref.Name, why)}
		s.remember(func(m *jobMemory) {
			m.withdrawn, m.warmPod, m.created, m.events, m.warmStart, m.gone = ref, handoff.PodRef{}, false, nil, start, nil
		})
		r.event(job, s.pod, corev1.EventTypeWarning, EventStartedCold, "CreatePod", "%s", start.message)
	} else if m.withdrawnLetGo {
		return nil
	}
	err := r.updateStatus(ctx, job, func(st *bkv1.BuildJobStatus) {
		if st.PodName != gone.Name && (st.PodName != "" || !conditionIs(job, bkv1.ConditionPodCreated, metav1.ConditionTrue)) {
			return // the status never recorded the warm pod, or has let go of it
		}
		st.PodName = ""
		st.Times.PodCreatedAt, st.Times.StartedAt = nil, nil
		meta.RemoveStatusCondition(&st.Conditions, bkv1.ConditionPodCreated)
		meta.RemoveStatusCondition(&st.Conditions, bkv1.ConditionStarted)
		st.Phase = bkv1.PhasePending
		st.Message = fmt.Sprintf("Warm pod %s stopped before taking the job; the job starts in a pod of its own.", gone.Name)
		// With this write, which has to be made anyway; when the status never recorded
		// the warm pod, the write that records the cold one says it.
		recordWarmStart(s, nil)
	})
	if err != nil {
		return err
	}
	if err := r.letGoOfWarm(ctx, s, gone); err != nil {
		return err
	}
	r.opts.Handoff.Forget(gone)
	s.remember(func(m *jobMemory) { m.withdrawnLetGo = true })
	if s.pod == nil || s.pod.UID == gone.UID {
		s.pod, s.podRead = nil, true
	}
	return nil
}

// stoppedWarmPod is the job's warm pod, and what became of it, when it stopped or is
// being stopped; "" when the job's pod is no warm pod, or runs on, or the job is being
// stopped anyway (its BuildJob deleted, or the operator stopping its pod: stopping),
// which ends it as before.
func (s *scope) stoppedWarmPod() (handoff.PodRef, string) {
	job, pod := s.job, s.pod
	if !job.DeletionTimestamp.IsZero() || stopping(job) != nil {
		return handoff.PodRef{}, ""
	}
	if pod == nil {
		// Gone without a trace (its finalizer removed by force): only this process knows
		// which pod it was, down to its UID.
		ref := s.memory().warmPod
		if ref.UID == "" || !s.podMade() || (job.Status.PodName != "" && job.Status.PodName != ref.Name) {
			return handoff.PodRef{}, ""
		}
		return ref, "it disappeared without the operator seeing how it ended."
	}
	if pod.Labels[podbuilder.LabelWarmPool] == "" {
		return handoff.PodRef{}, ""
	}
	return handoff.RefTo(pod), warmStopped(pod)
}

// warmStopped says, in a sentence, how a warm pod stopped, or is being stopped; "" while
// it runs on (or is still starting).
func warmStopped(pod *corev1.Pod) string {
	deleted := !pod.DeletionTimestamp.IsZero()
	if !deleted && !podstate.WarmOver(pod) && podstate.Ended(pod) == nil {
		return ""
	}
	if d := podDisruption(pod); d != nil {
		return d.what
	}
	switch t := podstate.JobEnded(pod); {
	case deleted:
		return "it was deleted."
	case t != nil:
		return fmt.Sprintf("its supervisor's container ended with exit code %d%s.", t.ExitCode, describeTermination(t))
	case pod.Status.Phase == corev1.PodFailed:
		return sentence("it failed", strings.TrimSpace(pod.Status.Reason+" "+pod.Status.Message))
	}
	return "it can never start its containers (an image it cannot have)."
}

// letGoOfWarm lets go of gone, a warm pod the job was withdrawn from: it is deleted (it
// is dead or dying, and no pool counts it any more), and its finalizer, the job's label
// and the job's ownership are taken off, so that it goes as soon as it has stopped and
// nothing takes it for the job's pod again. A pod that is gone already needs nothing.
func (r *Reconciler) letGoOfWarm(ctx context.Context, s *scope, gone handoff.PodRef) error {
	job := s.job
	pod := s.pod
	if pod == nil || pod.UID != gone.UID {
		pod = &corev1.Pod{}
		if err := r.apiReader.Get(ctx, types.NamespacedName{Namespace: gone.Namespace, Name: gone.Name}, pod); err != nil {
			return client.IgnoreNotFound(err)
		}
	} else {
		pod = pod.DeepCopy()
	}
	if pod.UID != gone.UID {
		return nil // made again under its name: another pod
	}
	// Deleted once, before the patch: a deletion cannot be undone, so the pod a conflict
	// has patchPod read again is being deleted already, or is gone, or is another pod.
	if pod.DeletionTimestamp.IsZero() {
		if err := r.client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting warm pod %s/%s, which stopped before taking its job: %w", pod.Namespace, pod.Name, err)
		}
	}
	ours := func(o metav1.OwnerReference) bool { return o.UID == job.UID }
	what := fmt.Sprintf("letting go of warm pod %s/%s, which stopped before taking its job", pod.Namespace, pod.Name)
	return r.patchPod(ctx, pod, what, func(pod *corev1.Pod) bool {
		if pod.UID != gone.UID {
			return false // made again under its name: another pod
		}
		if !held(pod) && !slices.ContainsFunc(pod.OwnerReferences, ours) && pod.Labels[podbuilder.LabelBuildJob] == "" {
			return false
		}
		controllerutil.RemoveFinalizer(pod, podbuilder.PodFinalizer)
		pod.OwnerReferences = slices.DeleteFunc(pod.OwnerReferences, ours)
		delete(pod.Labels, podbuilder.LabelBuildJob)
		return true
	})
}
