package spawner

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// gate is a client.Client and client.Reader whose requests block until released, counting
// how many are in flight at once: the limiter is about concurrency, which a real API
// server answering quickly would not show.
type gate struct {
	client.Client
	release        chan struct{}
	inFlight, peak atomic.Int32
}

func (g *gate) wait() error {
	n := g.inFlight.Add(1)
	for {
		p := g.peak.Load()
		if n <= p || g.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-g.release
	g.inFlight.Add(-1)
	return nil
}

func (g *gate) Create(context.Context, client.Object, ...client.CreateOption) error { return g.wait() }
func (g *gate) Update(context.Context, client.Object, ...client.UpdateOption) error { return g.wait() }
func (g *gate) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return g.wait()
}
func (g *gate) List(context.Context, client.ObjectList, ...client.ListOption) error { return g.wait() }

// TestKubeRequestsBounded: however many slots call at once, reads and writes together,
// no more than the limit reach the API server at a time, all of them are made in the
// end, and a caller whose context ends stops waiting.
func TestKubeRequestsBounded(t *testing.T) {
	const limit, callers = 4, 50
	g := &gate{release: make(chan struct{})}
	lim := newLimiter(limit)
	w, r := limitedWriter{Client: g, l: lim}, limitedReader{r: g, l: lim}
	ctx := context.Background()
	calls := []func() error{
		func() error { return w.Create(ctx, &corev1.Secret{}) },
		func() error { return w.Update(ctx, &corev1.Secret{}) },
		func() error { return r.Get(ctx, client.ObjectKey{Name: "x"}, &corev1.Secret{}) },
		func() error { return r.List(ctx, &corev1.SecretList{}) },
	}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() { assert.NoError(t, calls[i%len(calls)]()) })
	}
	require.Eventually(t, func() bool { return g.inFlight.Load() == limit }, 5*time.Second, time.Millisecond)

	// A caller that gives up while waiting for its turn is not kept.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, w.Create(cctx, &corev1.Secret{}), context.DeadlineExceeded)

	for range callers {
		g.release <- struct{}{}
	}
	wg.Wait()
	assert.Equal(t, int32(limit), g.peak.Load(), "requests in flight at once")
	assert.Zero(t, g.inFlight.Load())
}
