package buildjob

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
)

// jobMemory is what this process remembers of one BuildJob between its reconciles: what it
// did that its cache may not show yet, and what it keeps to save calls. None of it needs
// to survive a restart: a restarted controller reads the API server where the cache may
// lag, and asks Buildkite again.
type jobMemory struct {
	// created: the pod was created, which the status may not say yet (no status is
	// written with the create), nor a cached copy of the BuildJob older than the write
	// that records it: a pod the cache does not show is looked up in the API server
	// rather than created again, and one that is gone is lost, not to be made again.
	// Cleared when the job is reported, or withdrawn from a warm pod to start cold.
	created bool
	// deleted: the pod of a reported job was deleted, so that a reconcile reading the
	// cache before the deletion shows does not delete it again.
	deleted bool
	// reported is the UID of the BuildJob whose report this process recorded: a cached
	// copy of it that is not reported is older than that write (its informer lags the
	// pods', whose events bring reconciles too), and nothing is done from it: its pod,
	// deleted after the report, would be made again.
	reported types.UID
	// shown is the wait notice (waitNotice.key) this process last wrote to Buildkite,
	// which the cached BuildJob's WaitShown condition may not show yet; "" for none.
	shown string
	// gone is the job's pod as the watch last showed it, with its deletion, when the job's
	// outcome may not have been read from it (rememberGone): the pod has no finalizer, so
	// this is all that is left of it. Cleared once the job is reported.
	gone *corev1.Pod
	// polled is when Buildkite was last asked for the state of the job, while its command
	// has not started (pollDue).
	polled time.Time
	// client is the job's Buildkite client, kept for as long as its endpoint and token
	// stay the same, and dropped once Buildkite is told how the job ended: no more calls.
	client *jobClient
	// warmPod is the warm pod this process assigned the job (takeWarmPod): its name finds
	// the pod until the status names it (it is not named after the BuildJob, as the job's
	// own pod is), and its UID withdraws the job from it should the pod vanish before
	// its hand-off (startColdIfWarmStopped). Cleared when the job is withdrawn from it.
	warmPod handoff.PodRef
	// withdrawn is the warm pod that stopped before taking the job, which this process
	// took the job back from (startColdIfWarmStopped): the job starts cold, and that pod
	// is never the job's pod again.
	withdrawn handoff.PodRef
	// withdrawnLetGo: the status and the pod have both let go of the withdrawn pod.
	withdrawnLetGo bool
	// warmStart is why the job of an environment with a warm pool starts where it does
	// (takeWarmPod, startColdIfWarmStopped), for its WarmStart condition: written with the
	// status write that records the pod (or the wait for one, or the outcome), not with
	// one of its own. A warm pod says it was one itself (its label), so only a cold
	// start's reason is lost with a restart before that write.
	warmStart warmStart
	// events are the pod's events as last listed, while reconciles in a row read them
	// (scope.podEvents): a slow pod's state changes come faster than its events matter.
	events *eventsMemo
}

// eventsMemo is the list of a pod's events, and when it was made.
type eventsMemo struct {
	pod   types.UID
	at    time.Time
	items []corev1.Event
}

// jobClient is a Buildkite client, with the endpoint and token it was made for.
type jobClient struct {
	endpoint, token string
	c               *agentapi.Client
}

// memory keeps a jobMemory per BuildJob, for as long as the BuildJob exists: Reconcile
// forgets it when the BuildJob is gone.
type memory struct {
	mu sync.Mutex
	m  map[types.NamespacedName]jobMemory
}

// get is what is remembered of key (the zero jobMemory for nothing).
func (m *memory) get(key types.NamespacedName) jobMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.m[key]
}

// update applies change to what is remembered of key. A memory left empty is dropped.
func (m *memory) update(key types.NamespacedName, change func(*jobMemory)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.m[key]
	change(&e)
	if e == (jobMemory{}) {
		delete(m.m, key)
		return
	}
	if m.m == nil {
		m.m = map[types.NamespacedName]jobMemory{}
	}
	m.m[key] = e
}

// forget drops all that is remembered of key: its BuildJob is gone.
func (m *memory) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
}
