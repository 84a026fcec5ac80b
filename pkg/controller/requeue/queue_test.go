package requeue_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/util/workqueue"

	"github.com/buildkite-operator/buildkite-operator/pkg/controller/requeue"
)

func newQueue(t *testing.T) *requeue.Queue[string] {
	t.Helper()
	q := requeue.New[string]("test", workqueue.DefaultTypedControllerRateLimiter[string]()).(*requeue.Queue[string])
	t.Cleanup(q.ShutDown)
	return q
}

// get takes the next item, or "" when none comes within wait.
func get(q *requeue.Queue[string], wait time.Duration) string {
	got := make(chan string, 1)
	go func() {
		item, shutdown := q.Get()
		if shutdown {
			got <- ""
			return
		}
		q.Done(item)
		got <- item
	}()
	select {
	case item := <-got:
		return item
	case <-time.After(wait):
		return ""
	}
}

func TestQueueKeepsOnlyTheLatestWakeUp(t *testing.T) {
	cases := []struct {
		name string
		// then runs after AddAfter("job", 50ms), as a reconcile's end would.
		then     func(q *requeue.Queue[string])
		want     string
		wantWait time.Duration
	}{
		{"a wake-up alone comes", func(*requeue.Queue[string]) {}, "job", 0},
		{"a successful reconcile after it drops it", func(q *requeue.Queue[string]) { q.Forget("job") }, "", 0},
		{"a later wake-up replaces it", func(q *requeue.Queue[string]) { q.Forget("job"); q.AddAfter("job", 300*time.Millisecond) }, "job", 250 * time.Millisecond},
		{"another item's reconcile keeps it", func(q *requeue.Queue[string]) { q.Forget("other") }, "job", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			q := newQueue(t)
			start := time.Now()
			q.AddAfter("job", 50*time.Millisecond)
			tc.then(q)
			got := get(q, time.Second)
			assert.Equal(t, tc.want, got)
			if tc.want != "" {
				assert.GreaterOrEqual(t, time.Since(start), max(tc.wantWait, 50*time.Millisecond), "the wake-up came before it was due")
			}
		})
	}
}

func TestQueueEventsStillCome(t *testing.T) {
	q := newQueue(t)
	q.AddAfter("job", time.Hour)
	q.Add("job")
	require.Equal(t, "job", get(q, time.Second), "a watch event brings its reconcile at once")
	assert.Equal(t, 1, q.Pending(), "the wake-up stays until a reconcile succeeds")
	q.Forget("job")
	assert.Equal(t, 0, q.Pending())
}

func TestQueueFailureKeepsTheWakeUp(t *testing.T) {
	q := newQueue(t)
	q.AddAfter("job", 200*time.Millisecond)
	q.AddRateLimited("job") // a reconcile that failed: retried with back-off
	require.Equal(t, "job", get(q, time.Second), "the retry comes")
	assert.Equal(t, 1, q.Pending(), "a failed reconcile decided nothing: the wake-up asked for before stays")
	assert.Equal(t, "job", get(q, time.Second), "and comes")
}

func TestQueueShutDownDropsWakeUps(t *testing.T) {
	q := newQueue(t)
	q.AddAfter("job", 20*time.Millisecond)
	q.ShutDown()
	assert.Equal(t, 0, q.Pending())
	q.AddAfter("job", time.Millisecond)
	assert.Equal(t, 0, q.Pending(), "nothing is kept after shut-down")
}
