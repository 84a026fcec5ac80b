package spawner

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Idle heartbeats hold no goroutine each: a thousand slots waiting for their next
// heartbeat cost one scheduling goroutine, which goes once the last heartbeat stops.
func TestIdleHeartbeatsHoldNoGoroutine(t *testing.T) {
	h := newHeartbeats()
	before := runtime.NumGoroutine()
	beats := make([]*beat, 1000)
	for i := range beats {
		beats[i] = h.start(time.Hour, func(context.Context) bool { return true })
	}
	assert.LessOrEqual(t, runtime.NumGoroutine()-before, 1)
	for _, b := range beats {
		h.stop(b)
	}
	// Polled here: assert.Eventually would count a goroutine of its own.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before, "the scheduling goroutine outlived the last heartbeat")
}

// Each heartbeat is sent every interval, never twice at once; stop waits for the one
// being sent (its context is canceled) and none is sent after; a send that says to stop
// (a revoked agent) is the last.
func TestHeartbeats(t *testing.T) {
	h := newHeartbeats()
	const interval = 5 * time.Millisecond
	type counter struct{ sent, inFlight, maxInFlight atomic.Int32 }
	counters := make([]*counter, 20)
	beats := make([]*beat, len(counters))
	for i := range counters {
		c := &counter{}
		counters[i] = c
		beats[i] = h.start(interval, func(ctx context.Context) bool {
			n := c.inFlight.Add(1)
			defer c.inFlight.Add(-1)
			for {
				m := c.maxInFlight.Load()
				if n <= m || c.maxInFlight.CompareAndSwap(m, n) {
					break
				}
			}
			// Some sends take several intervals, as a retried call does.
			if c.sent.Add(1)%3 == 0 {
				select {
				case <-time.After(3 * interval):
				case <-ctx.Done():
				}
			}
			return true
		})
	}
	require.Eventually(t, func() bool {
		for _, c := range counters {
			if c.sent.Load() < 6 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "every heartbeat sent 6 times")
	for i, b := range beats {
		h.stop(b)
		c := counters[i]
		assert.Zero(t, c.inFlight.Load(), "stop returned while a heartbeat was being sent")
		assert.Equal(t, int32(1), c.maxInFlight.Load(), "two heartbeats of one slot at once")
	}
	sent := make([]int32, len(counters))
	for i, c := range counters {
		sent[i] = c.sent.Load()
	}
	time.Sleep(10 * interval)
	for i, c := range counters {
		assert.Equal(t, sent[i], c.sent.Load(), "a heartbeat sent after stop")
	}

	var revoked atomic.Int32
	b := h.start(interval, func(context.Context) bool { revoked.Add(1); return false })
	require.Eventually(t, func() bool { return revoked.Load() > 0 }, 10*time.Second, time.Millisecond)
	time.Sleep(10 * interval)
	assert.Equal(t, int32(1), revoked.Load(), "heartbeats went on after a send said to stop")
	h.stop(b) // stopping one that stopped itself is fine

	// stop cancels a heartbeat being sent and waits for it.
	var wg sync.WaitGroup
	wg.Add(1)
	canceled := make(chan struct{})
	b = h.start(interval, func(ctx context.Context) bool {
		wg.Done()
		<-ctx.Done()
		close(canceled)
		return true
	})
	wg.Wait()
	h.stop(b)
	select {
	case <-canceled:
	default:
		t.Fatal("stop returned before the heartbeat being sent did")
	}
}
