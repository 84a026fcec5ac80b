package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Bounds and defaults of spec.warmPool. WarmPoolMaxSize is also the value of the
// +kubebuilder:validation:Maximum markers on WarmPool.Size and MaxSize, which must stay
// the same.
const (
	// WarmPoolMaxSize is the largest pool an environment may keep.
	WarmPoolMaxSize = 20
	// DefaultWarmPoolMaxIdle is how long a warm pod waits for a job before it is replaced,
	// when spec.warmPool.maxIdle is unset: long enough that a steady queue keeps its pods,
	// short enough that an idle pod's image and settings do not go stale for hours.
	DefaultWarmPoolMaxIdle = 30 * time.Minute
	// MinWarmPoolMaxIdle and MaxWarmPoolMaxIdle bound spec.warmPool.maxIdle. Below a
	// minute pods would be replaced about as fast as they start; past a day an idle pod
	// keeps an image tag's old digest and a CA bundle long after they changed.
	MinWarmPoolMaxIdle = time.Minute
	MaxWarmPoolMaxIdle = 24 * time.Hour
)

// WarmPool keeps pods of the environment running before any job needs them, so that a job
// starts in a pod that is already up. Each warm pod is built as a job's pod of the
// environment would be, less what only a job knows; it waits for one job, gets it over the
// operator's hand-off endpoint, and is never reused. A job that no warm pod fits (one that
// asks for its own resources, say) starts in a new pod, as without a pool.
// +kubebuilder:validation:XValidation:rule="!has(self.maxSize) || self.maxSize >= (has(self.size) ? self.size : 0)",message="warmPool.maxSize must be at least warmPool.size: size is the pool's floor, maxSize its ceiling"
type WarmPool struct {
	// Size is how many idle warm pods the operator keeps for the environment, from 0 (no
	// pool, the default) to 20; with maxSize, it is the pool's floor. The pools of a
	// namespace keep together no more idle pods than the operator's free slots, and make
	// none while a job waits for quota.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=20
	// +kubebuilder:default=0
	// +optional
	Size int32 `json:"size,omitempty"`
	// MaxSize is the pool's ceiling, from size to 20. Between size and maxSize the pool
	// follows demand: it keeps as many idle pods as there are jobs waiting for an agent on
	// the operator's queue, read from Buildkite's REST API, when the operator has a
	// Buildkite API token (agentd's --buildkite-api-token-file, with the read_builds
	// scope). Without a token, or while Buildkite cannot be read, the pool stays at size.
	// Unset, the pool is always size.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=20
	// +optional
	MaxSize *int32 `json:"maxSize,omitempty"`
	// MaxIdle is how long a warm pod may wait for a job before the operator replaces it
	// with a fresh one, so that images and tokens do not go stale: from 1m to 24h, 30m
	// (DefaultWarmPoolMaxIdle) when unset.
	// +optional
	MaxIdle *metav1.Duration `json:"maxIdle,omitempty"`
}

// EffectiveMaxIdle is spec.warmPool.maxIdle, or DefaultWarmPoolMaxIdle when it is unset.
func (w *WarmPool) EffectiveMaxIdle() time.Duration {
	if w == nil || w.MaxIdle == nil {
		return DefaultWarmPoolMaxIdle
	}
	return w.MaxIdle.Duration
}

// Ceiling is the most idle warm pods the pool may keep while jobs wait: spec.warmPool.maxSize,
// or size when maxSize is unset (a pool that does not follow demand). Whatever an object
// the webhook did not check says, it is never below size, so that the floor holds, nor
// above WarmPoolMaxSize.
func (w *WarmPool) Ceiling() int32 {
	if w == nil {
		return 0
	}
	if w.MaxSize == nil || *w.MaxSize < w.Size {
		return w.Size
	}
	return min(*w.MaxSize, max(w.Size, WarmPoolMaxSize))
}

// FollowsDemand reports whether the pool may grow past its size with the queue's waiting
// jobs: maxSize is set above size.
func (w *WarmPool) FollowsDemand() bool {
	return w.Ceiling() > w.Floor()
}

// Floor is the fewest idle warm pods the pool keeps, spec.warmPool.size: the whole pool
// unless it follows demand. 0 without spec.warmPool.
func (w *WarmPool) Floor() int32 {
	if w == nil {
		return 0
	}
	return w.Size
}

// WarmPoolSize is how many idle warm pods the environment keeps at least (the pool's
// floor, spec.warmPool.size): 0 without spec.warmPool. A pool that follows demand
// (FollowsDemand) may keep up to WarmPool.Ceiling.
func (s *BuildEnvironmentSpec) WarmPoolSize() int32 {
	return s.WarmPool.Floor()
}

// HasWarmPool reports whether the environment may keep warm pods at all: its pool's
// ceiling is above 0. A pool of size 0 with a maxSize has warm pods while jobs wait.
func (s *BuildEnvironmentSpec) HasWarmPool() bool {
	return s.WarmPool.Ceiling() > 0
}

// WarmPoolStatus is what the environment's warm pool holds now.
type WarmPoolStatus struct {
	// Size is how many idle warm pods the pool keeps now: spec.warmPool.size, or more, up
	// to maxSize, while jobs wait for an agent on the operator's queue.
	// +optional
	Size int32 `json:"size,omitempty"`
	// Idle warm pods: running, or starting, and waiting for a job.
	// +optional
	Idle int32 `json:"idle,omitempty"`
	// Assigned warm pods: given a job, which has not yet finished.
	// +optional
	Assigned int32 `json:"assigned,omitempty"`
	// Message says, for a person, what the pool's size follows (the jobs waiting on the
	// operator's queue, with a maxSize) or why it stays at spec.warmPool.size although it
	// has one, why the pool is short of its size, or why the environment's jobs start
	// cold, when they do.
	// +optional
	Message string `json:"message,omitempty"`
}
