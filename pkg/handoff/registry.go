package handoff

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
)

// PodRef names one pod for its whole life: a pod deleted and made again under the same
// name has a new UID, and is another pod.
type PodRef struct {
	Namespace string
	Name      string
	UID       types.UID
}

// RefTo is the PodRef of pod.
func RefTo(pod *corev1.Pod) PodRef {
	return PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
}

func (p PodRef) String() string { return fmt.Sprintf("%s/%s (uid %s)", p.Namespace, p.Name, p.UID) }

// Claim's answers other than a job.
var (
	// ErrUnknownPod: the pod is no warm pod the operator knows, or not this incarnation
	// of it.
	ErrUnknownPod = errors.New("the pod is not a warm pod of this operator")
	// ErrNotAssigned: the pod is a warm pod still waiting for a job.
	ErrNotAssigned = errors.New("the pod has no job assigned yet")
	// ErrAlreadyHandedOff: the pod has taken its job already; a pod takes one job, once.
	ErrAlreadyHandedOff = errors.New("the pod's job was handed off already")
	// ErrNotReady: the operator has not yet learned which warm pods there are (it has just
	// started), so it cannot say whether it knows the pod.
	ErrNotReady = errors.New("the operator is still learning its warm pods")
	// ErrAlreadyAssigned is Assign's: the pod has a job, or had one.
	ErrAlreadyAssigned = errors.New("the pod has been assigned a job already")
)

// Assignments is what the endpoint asks about a pod that proved who it is.
type Assignments interface {
	// Claim hands out the pod's job, exactly once: a second claim for the same pod gets
	// ErrAlreadyHandedOff. A pod not assigned yet gets ErrNotAssigned, a pod not known
	// ErrUnknownPod.
	Claim(ctx context.Context, pod PodRef) (handoffclient.Job, error)
	// Changed returns a channel closed at the pod's next change (an assignment, its
	// removal). Taken before a Claim, it misses no change after it. Nil (never closed) for
	// a pod not known.
	Changed(pod PodRef) <-chan struct{}
}

// State is where a warm pod is in its single use.
type State int

const (
	// StateUnknown: the registry has no such pod.
	StateUnknown State = iota
	// StateWaiting: a warm pod waiting for a job.
	StateWaiting
	// StateAssigned: a job is assigned and not yet taken.
	StateAssigned
	// StateHandedOff: the pod has taken its job.
	StateHandedOff
)

func (s State) String() string {
	switch s {
	case StateWaiting:
		return "Waiting"
	case StateAssigned:
		return "Assigned"
	case StateHandedOff:
		return "HandedOff"
	default:
		return "Unknown"
	}
}

// Registry is an in-memory Assignments for the operator: it registers warm pods, assigns
// each at most one job, and hands that job out once. It keeps a job only until it is
// handed off, so no job token lingers in it.
type Registry struct {
	mu    sync.Mutex
	ready bool
	pods  map[PodRef]*entry
}

type entry struct {
	state State
	job   handoffclient.Job
	// offeredAgain: the assignment repeats one an earlier operator process made (Reoffer),
	// so the pod may have taken the job then, which this registry cannot know: Withdraw
	// leaves it alone.
	offeredAgain bool
	// changed is closed, and replaced, at each change of the pod.
	changed chan struct{}
}

var _ Assignments = (*Registry)(nil)

// NewRegistry returns an empty registry that is not ready: until MarkReady, a pod it does
// not know is told to come back (ErrNotReady) rather than refused, because after an
// operator restart the warm pods exist before the registry has heard of them.
func NewRegistry() *Registry {
	return &Registry{pods: map[PodRef]*entry{}}
}

// MarkReady says that every warm pod there is has been registered (the controller's
// first sync is done): from now on a pod not known is refused.
func (r *Registry) MarkReady() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready = true
}

// Register records a warm pod waiting for a job. Registering a pod again changes nothing.
func (r *Registry) Register(pod PodRef) error {
	if err := pod.validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pods[pod]; !ok {
		r.pods[pod] = &entry{state: StateWaiting, changed: make(chan struct{})}
	}
	return nil
}

// Assign gives the pod its job, registering the pod if need be, and wakes its waiting
// hand-off. A pod is single-use: one that has or had a job gets ErrAlreadyAssigned.
func (r *Registry) Assign(pod PodRef, job handoffclient.Job) error {
	return r.assign(pod, job, false)
}

// Reoffer is Assign for a job that an earlier operator process assigned the pod: the
// pod may take it (if it had not), but whether it took it before is not known, so
// Withdraw never takes this assignment back.
func (r *Registry) Reoffer(pod PodRef, job handoffclient.Job) error {
	return r.assign(pod, job, true)
}

func (r *Registry) assign(pod PodRef, job handoffclient.Job, again bool) error {
	if err := pod.validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.pods[pod]
	if !ok {
		e = &entry{changed: make(chan struct{})}
		r.pods[pod] = e
	}
	if e.state == StateAssigned || e.state == StateHandedOff {
		return fmt.Errorf("assigning job %s to pod %s: %w", job.ID, pod, ErrAlreadyAssigned)
	}
	e.state, e.job, e.offeredAgain = StateAssigned, job, again
	e.wake()
	return nil
}

// Withdraw takes back the job assigned to pod, which has not taken it, so that the job can
// start elsewhere: the pod is forgotten, and its waiting hand-off wakes to a refusal. It
// holds the lock Claim holds, so a pod's job is either claimed or withdrawn, never both.
// It reports whether it withdrew the job; false leaves the pod as it was: the pod took
// its job (StateHandedOff) or has none, is not known, or its assignment was offered again
// after an operator restart (Reoffer), when nothing says it had not taken it before.
func (r *Registry) Withdraw(pod PodRef) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.pods[pod]
	if !ok || e.state != StateAssigned || e.offeredAgain {
		return false
	}
	delete(r.pods, pod)
	e.job = handoffclient.Job{}
	e.wake()
	return true
}

// Forget removes a pod that is gone, waking its waiting hand-off, and returns what the
// pod had come to: StateAssigned means its job was never handed off and can start
// elsewhere; StateHandedOff means the pod took it.
func (r *Registry) Forget(pod PodRef) State {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.pods[pod]
	if !ok {
		return StateUnknown
	}
	delete(r.pods, pod)
	e.wake()
	return e.state
}

// State says where the pod is.
func (r *Registry) State(pod PodRef) State {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.pods[pod]; ok {
		return e.state
	}
	return StateUnknown
}

// Claim implements Assignments. Only the exact pod (namespace, name and UID) matches.
func (r *Registry) Claim(_ context.Context, pod PodRef) (handoffclient.Job, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.pods[pod]
	if !ok {
		if !r.ready {
			return handoffclient.Job{}, ErrNotReady
		}
		return handoffclient.Job{}, ErrUnknownPod
	}
	switch e.state {
	case StateWaiting:
		return handoffclient.Job{}, ErrNotAssigned
	case StateHandedOff:
		return handoffclient.Job{}, ErrAlreadyHandedOff
	}
	job := e.job
	e.state, e.job = StateHandedOff, handoffclient.Job{}
	e.wake()
	return job, nil
}

// Changed implements Assignments.
func (r *Registry) Changed(pod PodRef) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.pods[pod]; ok {
		return e.changed
	}
	return nil
}

func (e *entry) wake() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (p PodRef) validate() error {
	if p.Namespace == "" || p.Name == "" || p.UID == "" {
		return fmt.Errorf("warm pod %s: namespace, name and UID are all needed, so that a pod made again under the same name is not taken for it", p)
	}
	return nil
}
