package spawner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What Buildkite holds a slot in lives in its Secret's annotations, beside any a person
// put there, and comes back from them as it was written.
func TestHeldAnnotations(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("x", 3600))
	cases := []struct {
		name          string
		held, message string
		before        map[string]string // the Secret's annotations before the save
		want          map[string]string
	}{
		{
			name: "paused",
			held: SlotPaused, message: "maintenance",
			want: map[string]string{AnnotationSlotState: SlotPaused, AnnotationSlotStateSince: "2026-03-04T04:06:07Z", AnnotationSlotStateMessage: "maintenance"},
		},
		{
			name:   "stopped, no message, beside a person's annotation",
			held:   SlotStopped,
			before: map[string]string{"team": "ci"},
			want:   map[string]string{"team": "ci", AnnotationSlotState: SlotStopped, AnnotationSlotStateSince: "2026-03-04T04:06:07Z"},
		},
		{
			name:   "let go: the slot's annotations go, a person's stay",
			before: map[string]string{"team": "ci", AnnotationSlotState: SlotPaused, AnnotationSlotStateSince: "x", AnnotationSlotStateMessage: "m"},
			want:   map[string]string{"team": "ci"},
		},
		{
			name: "nothing held, nothing there",
			want: nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var st slotState
			st.AgentID = "agent-1"
			st.hold(tc.held, tc.message, at)
			sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: tc.before}}
			st.annotate(sec)
			sec.Data = st.data()
			if tc.want == nil {
				assert.Empty(t, sec.Annotations)
			} else {
				assert.Equal(t, tc.want, sec.Annotations)
			}
			back := stateFromSecret(sec)
			assert.Equal(t, st, back, "read back as written")
			assert.Equal(t, tc.held == SlotPaused, back.paused())
			assert.Equal(t, tc.held == SlotStopped, back.stopped())
		})
	}
	t.Run("a value the spawner does not write is ignored", func(t *testing.T) {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationSlotState: "Stopped"}}}
		assert.Empty(t, stateFromSecret(sec).Held)
	})
}

// A slot Buildkite stopped is down on purpose: it neither keeps the operator unready nor
// fails its liveness, until it is let go of and must register again.
func TestHealthStoppedSlot(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHealth()
	h.now = func() time.Time { return now }
	h.start(2)
	h.tried(0, true)
	h.tried(1, false)
	require.EqualError(t, h.ready(), "1 of 2 slots are registered with Buildkite")

	h.stopped(1, true)
	assert.NoError(t, h.ready(), "the stopped slot is not waited for")
	now = now.Add(StaleAfter + time.Second)
	h.tried(0, true)
	assert.NoError(t, h.live(), "nor expected to ping")

	h.stopped(1, false)
	assert.EqualError(t, h.ready(), "1 of 2 slots are registered with Buildkite", "let go of, it must register")
	assert.NoError(t, h.live(), "and has StaleAfter from now to try")
	now = now.Add(StaleAfter + time.Second)
	h.tried(0, true)
	assert.ErrorContains(t, h.live(), "slot 1 has not pinged")
}
