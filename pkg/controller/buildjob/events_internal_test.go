package buildjob

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// eventLister answers every list of events with one event, and counts the lists.
type eventLister struct {
	client.Reader
	lists int
}

func (l *eventLister) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l.lists++
	list.(*corev1.EventList).Items = []corev1.Event{{Reason: "Pulling"}}
	return nil
}

// A pending pod's events are listed once per JobStatePollInterval over reconciles in a
// row that read them, and forgotten by the first reconcile that does not.
func TestPodEventsAreListedOncePerPollInterval(t *testing.T) {
	lister := &eventLister{}
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	r := &Reconciler{apiReader: lister, opts: Options{JobStatePollInterval: 5 * time.Second}.withDefaults()}
	job := &bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: "j"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "jobs", Name: "p", UID: "uid-1"}}
	reconcileAt := func(at time.Time, readsEvents bool) {
		t.Helper()
		s := r.newScope(job)
		s.now, s.pod, s.podRead = at, pod, true
		if readsEvents {
			events, err := s.podEvents(context.Background())
			require.NoError(t, err)
			require.Len(t, events, 1)
			_, err = s.podEvents(context.Background())
			require.NoError(t, err)
		}
		s.forgetEvents()
	}

	reconcileAt(now, true)
	assert.Equal(t, 1, lister.lists, "listed once in a reconcile")
	reconcileAt(now.Add(2*time.Second), true)
	assert.Equal(t, 1, lister.lists, "a reconcile within the interval uses the list before")
	reconcileAt(now.Add(6*time.Second), true)
	assert.Equal(t, 2, lister.lists, "listed again once the interval has passed")

	reconcileAt(now.Add(7*time.Second), false)
	assert.Nil(t, r.memory.get(client.ObjectKeyFromObject(job)).events, "forgotten once a reconcile does not read them")
	reconcileAt(now.Add(8*time.Second), true)
	assert.Equal(t, 3, lister.lists)

	pod = pod.DeepCopy()
	pod.UID = "uid-2"
	reconcileAt(now.Add(9*time.Second), true)
	assert.Equal(t, 4, lister.lists, "another pod's events are its own")
}
