// Package requeue is a controller work queue that keeps, for each object, only the wake-up
// its latest reconcile asked for.
//
// client-go's delaying queue keeps every RequeueAfter it is given: a reconcile that asks to
// look again in 5 s, followed a moment later by a watch event whose reconcile asks for
// nothing (or for 1 h), still brings the 5 s reconcile, which finds nothing to do. For a
// short job, those stale wake-ups were about half of all its reconciles. Each reconcile
// reads the whole state and says when it must look again, so the latest reconcile's answer
// is the only one that counts: when a reconcile ends without an error, the wake-ups asked
// for before it are dropped, and the one it asks for (if any) is kept.
//
// Events and retries after an error are not changed: a watch event always brings a
// reconcile, and a failed reconcile is retried with the rate limiter's back-off, as before.
package requeue

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// Queue is a rate-limiting work queue with one pending wake-up per item.
type Queue[T comparable] struct {
	workqueue.TypedRateLimitingInterface[T]

	mu     sync.Mutex
	timers map[T]*time.Timer
	closed bool
}

// New returns a Queue named name (for the work queue's metrics) over client-go's
// rate-limiting queue, with rateLimiter for retries after errors. Its signature is
// controller-runtime's controller.Options.NewQueue.
func New[T comparable](name string, rateLimiter workqueue.TypedRateLimiter[T]) workqueue.TypedRateLimitingInterface[T] {
	return &Queue[T]{
		TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(rateLimiter, workqueue.TypedRateLimitingQueueConfig[T]{Name: name}),
		timers:                     map[T]*time.Timer{},
	}
}

// AddAfter adds item after d, in place of any wake-up item already has.
func (q *Queue[T]) AddAfter(item T, d time.Duration) {
	if d <= 0 {
		q.Add(item)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.stopLocked(item)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		q.mu.Lock()
		current := q.timers[item] == t
		if current {
			delete(q.timers, item)
		}
		q.mu.Unlock()
		if current {
			q.Add(item)
		}
	})
	q.timers[item] = t
}

// Forget is called by the controller when a reconcile of item succeeded: the wake-ups
// asked for before are dropped (the reconcile's own RequeueAfter follows as AddAfter), and
// the rate limiter forgets the item's failures.
func (q *Queue[T]) Forget(item T) {
	q.TypedRateLimitingInterface.Forget(item)
	q.mu.Lock()
	q.stopLocked(item)
	q.mu.Unlock()
}

// Pending is how many items have a wake-up pending.
func (q *Queue[T]) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.timers)
}

// ShutDown drops every pending wake-up and shuts the queue down.
func (q *Queue[T]) ShutDown() {
	q.close()
	q.TypedRateLimitingInterface.ShutDown()
}

// ShutDownWithDrain drops every pending wake-up and shuts the queue down once the items
// being processed are done.
func (q *Queue[T]) ShutDownWithDrain() {
	q.close()
	q.TypedRateLimitingInterface.ShutDownWithDrain()
}

func (q *Queue[T]) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for item := range q.timers {
		q.stopLocked(item)
	}
}

func (q *Queue[T]) stopLocked(item T) {
	if t, ok := q.timers[item]; ok {
		t.Stop()
		delete(q.timers, item)
	}
}
