package spawner

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// heartbeats sends every slot's heartbeats from one scheduling goroutine, which starts a
// goroutine per heartbeat only while it is being sent. A goroutine per slot, waiting on a
// ticker for the slot's whole life, cost a stack per slot: a thousand idle slots held a
// thousand of them for a call every few seconds each.
//
// A heartbeat is sent an interval after its slot's previous one was due, as a ticker
// would: one that takes longer than the interval (a retried call) is followed by the next
// at once, and the beats it overlapped are dropped.
type heartbeats struct {
	mu      sync.Mutex
	queue   beatQueue
	running bool          // the scheduling goroutine runs
	wake    chan struct{} // tells it the queue's head changed
}

// beat is one slot's heartbeat.
type beat struct {
	interval time.Duration
	// send sends one heartbeat; it returns false when the heartbeats must stop (the
	// agent was revoked).
	send   func(ctx context.Context) bool
	ctx    context.Context
	cancel context.CancelFunc

	// Guarded by heartbeats.mu.
	due     time.Time
	index   int  // in the queue; -1 when not queued (being sent, or stopped)
	stopped bool // stop was called: never queued again
	// sending counts the heartbeat being sent, for stop to wait for.
	sending sync.WaitGroup
}

func newHeartbeats() *heartbeats {
	return &heartbeats{wake: make(chan struct{}, 1)}
}

// start schedules send every interval, the first an interval from now, until stop is
// called on the beat it returns or send returns false.
func (h *heartbeats) start(interval time.Duration, send func(ctx context.Context) bool) *beat {
	ctx, cancel := context.WithCancel(context.Background())
	b := &beat{interval: interval, send: send, ctx: ctx, cancel: cancel, index: -1}
	h.mu.Lock()
	defer h.mu.Unlock()
	b.due = time.Now().Add(interval)
	h.push(b)
	return b
}

// stop ends b's heartbeats and waits for one being sent to return.
func (h *heartbeats) stop(b *beat) {
	h.mu.Lock()
	b.stopped = true
	if b.index >= 0 {
		heap.Remove(&h.queue, b.index)
		h.poke() // the head may have changed, or the queue emptied: the goroutine goes
	}
	h.mu.Unlock()
	b.cancel()
	b.sending.Wait()
}

// push queues b, starting the scheduling goroutine or waking it. h.mu is held.
func (h *heartbeats) push(b *beat) {
	heap.Push(&h.queue, b)
	if !h.running {
		h.running = true
		go h.run()
		return
	}
	if b.index == 0 {
		h.poke()
	}
}

// poke wakes the scheduling goroutine to look at the queue again.
func (h *heartbeats) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run sends the heartbeats that are due, and returns when none is queued.
func (h *heartbeats) run() {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		h.mu.Lock()
		if len(h.queue) == 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		b := h.queue[0]
		wait := time.Until(b.due)
		if wait <= 0 {
			heap.Pop(&h.queue)
			b.sending.Add(1)
			h.mu.Unlock()
			go h.send(b)
			continue
		}
		h.mu.Unlock()
		t.Reset(wait)
		select {
		case <-t.C:
		case <-h.wake:
		}
	}
}

// send sends b's heartbeat, then queues its next one.
func (h *heartbeats) send(b *beat) {
	defer b.sending.Done()
	more := b.send(b.ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if b.stopped || !more || b.ctx.Err() != nil {
		return
	}
	b.due = b.due.Add(b.interval)
	if now := time.Now(); b.due.Before(now) {
		b.due = now
	}
	h.push(b)
}

// beatQueue is a heap of beats, the one due first on top.
type beatQueue []*beat

func (q beatQueue) Len() int           { return len(q) }
func (q beatQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q beatQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}

func (q *beatQueue) Push(x any) {
	b := x.(*beat)
	b.index = len(*q)
	*q = append(*q, b)
}

func (q *beatQueue) Pop() any {
	old := *q
	b := old[len(old)-1]
	old[len(old)-1] = nil
	b.index = -1
	*q = old[:len(old)-1]
	return b
}
