package spawner

import (
	"context"

	"golang.org/x/sync/semaphore"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxKubeRequests bounds the spawner's requests to the API server in flight at once.
//
// When a thousand slots take a job at once, each reads and writes the API server within the
// same second. Unbounded, every one of those requests is in flight together: at 1000 slots
// the kwok bench found some 800, each holding a slot's deep stack, an HTTP/2 stream's
// goroutine and its buffers (a fifth of agentd's peak memory), while the API server,
// answering a few hundred a second, served them no sooner, and the controller's own
// requests queued behind them. Waiting here costs a slot nothing it was not already
// waiting for, and keeps the rest of the operator's requests moving.
const maxKubeRequests = 32

// limiter lets at most its weight of requests run at once.
type limiter struct{ sem *semaphore.Weighted }

func newLimiter(n int) limiter { return limiter{semaphore.NewWeighted(int64(n))} }

// do runs f once fewer than the limit of others run, or returns ctx's error if ctx ends
// first.
func (l limiter) do(ctx context.Context, f func() error) error {
	if err := l.sem.Acquire(ctx, 1); err != nil {
		return err
	}
	defer l.sem.Release(1)
	return f()
}

// limitedWriter is a client whose writes go through a limiter. Its reads are the
// client's own (from the cache, which asks nothing of the API server).
type limitedWriter struct {
	client.Client
	l limiter
}

func (c limitedWriter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.l.do(ctx, func() error { return c.Client.Create(ctx, obj, opts...) })
}

func (c limitedWriter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.l.do(ctx, func() error { return c.Client.Update(ctx, obj, opts...) })
}

func (c limitedWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.l.do(ctx, func() error { return c.Client.Patch(ctx, obj, patch, opts...) })
}

func (c limitedWriter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.l.do(ctx, func() error { return c.Client.Delete(ctx, obj, opts...) })
}

// limitedReader is a reader of the API server itself whose reads go through a limiter.
type limitedReader struct {
	r client.Reader
	l limiter
}

func (r limitedReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return r.l.do(ctx, func() error { return r.r.Get(ctx, key, obj, opts...) })
}

func (r limitedReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.l.do(ctx, func() error { return r.r.List(ctx, list, opts...) })
}
