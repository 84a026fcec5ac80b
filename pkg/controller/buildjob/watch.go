package buildjob

import (
	"bytes"

	corev1 "k8s.io/api/core/v1"
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
//   - anything that happens to a stopped pod once the operator has let go of it (its
//     deletion after the retention): its outcome was read before the finalizer that kept
//     the pod came off.
var podEvents = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, oldOK := e.ObjectOld.(*corev1.Pod)
		pod, ok := e.ObjectNew.(*corev1.Pod)
		if !oldOK || !ok {
			return true
		}
		if !held(pod) && podstate.Stopped(pod) {
			return false // let go of, and nothing in it runs: its outcome was read
		}
		return podstate.StateChanged(old, pod) || (held(old) && !held(pod))
	},
	DeleteFunc: func(e event.DeleteEvent) bool {
		pod, ok := e.Object.(*corev1.Pod)
		return !ok || !podstate.Stopped(pod)
	},
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
