package buildjob

import (
	"bytes"
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

// Which watch events of the objects a BuildJob owns bring a reconcile. Each reconcile reads
// everything and says when it must look again (requeue keeps only that wake-up), so an
// event is needed only where something happened that the controller must act on before
// that; everything else a pending pod shows is re-read on the pod's poll.

// podEvents lets through the events of a job pod that move it from one state to another
// (podstate.StateChanged), and the end of the operator's hold on a pod whose command could
// still run (its finalizer removed, or the pod gone, by someone else). Left out:
//
//   - the pod's creation: the reconcile that created it asked to look again already, and a
//     restarted controller reconciles every BuildJob anyway;
//   - its status refining a state (messages, readiness, the node it was bound to);
//   - anything that happens to a pod after the event that showed its job container ended
//     (its deletion after the retention), but the end of a hold: its outcome was read on
//     that event, and a pod that vanished before is asked of Buildkite (lostPod). A
//     pod stopped for want of a node or an image is followed on: the controller
//     deletes it, and waits to see it stop (stopPod).
var podEvents = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*corev1.Pod)
		pod, ok := e.ObjectNew.(*corev1.Pod)
		if !oldOK || !ok {
			return true
		}
		// Someone else's hand: the operator lets go of a pod only once it has stopped.
		released := held(old) && !held(pod) && !podstate.Stopped(pod)
		if podstate.JobEnded(old) != nil && podstate.JobEnded(pod) != nil && !released {
			return false // its outcome was read on the event that showed its end
		}
		return podstate.StateChanged(old, pod) || released
	},
	DeleteFunc: func(e event.DeleteEvent) bool {
		pod, ok := e.Object.(*corev1.Pod)
		return !ok || !podstate.Stopped(pod)
	},
}

// rememberGone keeps the last sight of a job's pod that the watch gives with its deletion
// (jobMemory.gone), for the reconcile that follows: the pod carries no finalizer, so one
// deleted with force, or by the pod garbage collector with its node, can be gone before a
// reconcile reads how its job ended, and then this is all that is left of it. Kept only
// while its BuildJob is unreported (reporting clears it), so that a pod deleted after the
// report, or with its BuildJob, leaves nothing behind. It lets every event on: podEvents
// filters them.
func (r *Reconciler) rememberGone() predicate.Funcs {
	return predicate.Funcs{DeleteFunc: func(e event.DeleteEvent) bool {
		pod, ok := e.Object.(*corev1.Pod)
		if !ok {
			return true
		}
		owner := metav1.GetControllerOf(pod)
		if owner == nil || owner.Kind != "BuildJob" {
			return true
		}
		key := types.NamespacedName{Namespace: pod.Namespace, Name: owner.Name}
		if r.memory.get(key).deleted {
			// The controller deleted it after the job's report (deletePod): most pods go
			// so, and need no read of their BuildJob to tell.
			return true
		}
		job := &bkv1.BuildJob{}
		if err := r.client.Get(context.Background(), key, job); err != nil || job.UID != owner.UID || reported(job) {
			return true
		}
		r.memory.update(key, func(m *jobMemory) {
			if pod.UID != m.withdrawn.UID { // a warm pod the job was taken back from is not its pod
				m.gone = pod
			}
		})
		return true
	}}
}

// held: the operator's finalizer keeps pod until the job's outcome is recorded.
func held(pod *corev1.Pod) bool {
	return controllerutil.ContainsFinalizer(pod, podbuilder.PodFinalizer)
}

// tokenSecretEvents lets through a job token Secret's creation (a BuildJob may be waiting
// for it) and a change of its token or seal (a Secret from before seals being sealed). Its
// deletion needs no reconcile of its own: the controller reads the token when it next
// calls Buildkite, and waits for the Secret to come back then.
var tokenSecretEvents = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*corev1.Secret)
		sec, ok := e.ObjectNew.(*corev1.Secret)
		if !oldOK || !ok {
			return true
		}
		for _, k := range []string{bkv1.DefaultSecretKey, bkv1.TokenSecretSealKey} {
			if !bytes.Equal(old.Data[k], sec.Data[k]) {
				return true
			}
		}
		return false
	},
	DeleteFunc: func(event.DeleteEvent) bool { return false },
}
