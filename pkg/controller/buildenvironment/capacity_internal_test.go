package buildenvironment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

func TestShareSlots(t *testing.T) {
	cases := []struct {
		name  string
		free  int
		sizes map[string]int
		want  map[string]int
	}{
		{name: "enough for all", free: 10, sizes: map[string]int{"a": 3, "b": 4}, want: map[string]int{"a": 3, "b": 4}},
		{name: "none free", free: 0, sizes: map[string]int{"a": 3, "b": 4}, want: map[string]int{"a": 0, "b": 0}},
		{name: "more jobs than slots", free: -2, sizes: map[string]int{"a": 3}, want: map[string]int{"a": 0}},
		{name: "one pool", free: 2, sizes: map[string]int{"a": 5}, want: map[string]int{"a": 2}},
		{name: "even", free: 4, sizes: map[string]int{"a": 3, "b": 3}, want: map[string]int{"a": 2, "b": 2}},
		{name: "the odd one to the first name", free: 3, sizes: map[string]int{"b": 2, "a": 2}, want: map[string]int{"a": 2, "b": 1}},
		{name: "a small pool leaves the rest to the others", free: 7, sizes: map[string]int{"a": 1, "b": 5, "c": 5}, want: map[string]int{"a": 1, "b": 3, "c": 3}},
		{name: "the odd ones to the larger pools by name", free: 6, sizes: map[string]int{"a": 1, "b": 5, "c": 5, "d": 2}, want: map[string]int{"a": 1, "b": 2, "c": 2, "d": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, shareSlots(tc.free, tc.sizes))
		})
	}
}

// Each pool's share only grows as slots free up: a freed slot never takes a pod from a
// pool (and the limit to make pods up to is never above the one to keep them).
func TestShareSlotsGrowsWithFree(t *testing.T) {
	sizes := map[string]int{"a": 1, "b": 5, "c": 3, "d": 2, "e": 4}
	prev := shareSlots(0, sizes)
	for free := 1; free <= 16; free++ {
		got := shareSlots(free, sizes)
		sum := 0
		for name, n := range got {
			assert.GreaterOrEqual(t, n, prev[name], "free %d: pool %s", free, name)
			assert.LessOrEqual(t, n, sizes[name], "free %d: pool %s", free, name)
			sum += n
		}
		assert.Equal(t, min(free, 15), sum, "free %d: %v", free, got)
		prev = got
	}
}

func TestCapMessage(t *testing.T) {
	cases := []struct {
		name string
		cp   capacity
		want string
	}{
		{
			name: "all slots busy",
			cp:   capacity{slots: 8, holding: 8, sizes: map[string]int{"go": 3}},
			want: "The pool keeps none of its 3 idle pods: all 8 of the operator's slots are running jobs, and an idle warm pod is only of use to a slot that is free to take a job. It refills as jobs end.",
		},
		{
			name: "some busy",
			cp:   capacity{slots: 8, holding: 6, sizes: map[string]int{"go": 3}},
			want: "The pool keeps 2 of its 3 idle pods: 6 of the operator's 8 slots are running jobs, and an idle warm pod is only of use to a slot that is free to take a job. It refills as jobs end.",
		},
		{
			name: "shared",
			cp:   capacity{slots: 8, holding: 1, sizes: map[string]int{"go": 5, "rust": 5}},
			want: "The pool keeps 3 of its 5 idle pods: 1 of the operator's 8 slots is running a job, and the 7 free slots are shared among the warm pools of 2 BuildEnvironments, which ask for 10 idle pods in all (an idle warm pod is only of use to a slot that is free to take a job). It refills as jobs end.",
		},
		{
			name: "larger than the slots",
			cp:   capacity{slots: 2, sizes: map[string]int{"go": 3}},
			want: "The pool keeps 2 of its 3 idle pods: the operator has 2 slots (--slots), and an idle warm pod is only of use to a slot that is free to take a job.",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "go"
			if _, ok := tc.cp.sizes["rust"]; ok {
				name = "rust"
			}
			limit, _ := tc.cp.limits(name)
			assert.Equal(t, tc.want, tc.cp.capMessage(name, limit))
		})
	}
}

// capacityEvents lets through only what changes what the pools may keep.
func TestCapacityEvents(t *testing.T) {
	job := func(mods ...func(*bkv1.BuildJob)) *bkv1.BuildJob {
		j := &bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Name: "j", Annotations: map[string]string{bkv1.AnnotationIntake: "nonce"}}}
		for _, m := range mods {
			m(j)
		}
		return j
	}
	now := metav1.Now()
	reported := func(j *bkv1.BuildJob) { j.Status.Times.ReportedAt = &now }
	byHand := func(j *bkv1.BuildJob) { j.Annotations = nil }
	podCreated := func(status metav1.ConditionStatus, reason string) func(*bkv1.BuildJob) {
		return func(j *bkv1.BuildJob) {
			j.Status.Conditions = append(j.Status.Conditions, metav1.Condition{Type: bkv1.ConditionPodCreated, Status: status, Reason: reason})
		}
	}
	running := func(j *bkv1.BuildJob) { j.Status.Phase = bkv1.PhaseRunning }
	quota := podCreated(metav1.ConditionFalse, bkv1.ReasonWaitingForQuota)
	created := podCreated(metav1.ConditionTrue, bkv1.ReasonPodCreated)
	cases := []struct {
		name     string
		old, new *bkv1.BuildJob
		want     bool
	}{
		{name: "reported", old: job(created), new: job(created, reported), want: true},
		{name: "its start decided", old: job(), new: job(created), want: true},
		{name: "waiting for quota", old: job(), new: job(quota), want: true},
		{name: "quota wait over", old: job(quota), new: job(created), want: true},
		{name: "a hand-made job's quota wait over", old: job(byHand, quota), new: job(byHand, created), want: true},
		{name: "a phase refined", old: job(created), new: job(created, running)},
		{name: "a hand-made job's start", old: job(byHand), new: job(byHand, created)},
		{name: "a hand-made job reported", old: job(byHand, created), new: job(byHand, created, reported)},
		{name: "already reported", old: job(created, reported), new: job(created, reported, running)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, capacityEvents.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}))
		})
	}
	assert.False(t, capacityEvents.Create(event.CreateEvent{Object: job()}), "a new job")
	assert.True(t, capacityEvents.Delete(event.DeleteEvent{Object: job(created)}), "a job holding a slot deleted")
	assert.False(t, capacityEvents.Delete(event.DeleteEvent{Object: job(created, reported)}), "a reported job deleted")
}
