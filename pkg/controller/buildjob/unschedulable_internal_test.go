package buildjob

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// A pod that waits for a node waits as long as the operator's bound allows (an autoscaler may
// still add one), but never past the job's own timeout: the job could not run to its end then.
func TestUnschedulableWaitIsBoundedByTheJobsTimeout(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	pod := func(age time.Duration) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: podcontract.JobContainer}}},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{
				Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
				Message: "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
			}}},
		}
	}
	job := func(minutes int32) *bkv1.BuildJob {
		j := &bkv1.BuildJob{}
		if minutes > 0 {
			j.Spec.TimeoutMinutes = &minutes
		}
		return j
	}
	cases := []struct {
		name     string
		job      *bkv1.BuildJob
		pod      *corev1.Pod
		bound    time.Duration
		wantFail bool
		wantLeft time.Duration
		wantText string
	}{
		{name: "no job timeout, inside the bound", job: job(0), pod: pod(6 * time.Minute), bound: 30 * time.Minute, wantLeft: 24 * time.Minute},
		{name: "no job timeout, past the bound", job: job(0), pod: pod(31 * time.Minute), bound: 30 * time.Minute, wantFail: true, wantText: "could not be scheduled for 30 minutes"},
		{name: "job timeout shorter, inside it", job: job(10), pod: pod(4 * time.Minute), bound: 30 * time.Minute, wantLeft: 6 * time.Minute},
		{name: "job timeout shorter, past it", job: job(10), pod: pod(11 * time.Minute), bound: 30 * time.Minute, wantFail: true, wantText: "could not be scheduled for 10 minutes, the job's own timeout"},
		{name: "job timeout longer than the bound", job: job(120), pod: pod(6 * time.Minute), bound: 30 * time.Minute, wantLeft: 24 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, left := unschedulable(tc.job, tc.pod, tc.bound, now)
			if !tc.wantFail {
				assert.Nil(t, o)
				assert.Equal(t, tc.wantLeft, left)
				return
			}
			require.NotNil(t, o)
			assert.Equal(t, bkv1.ReasonUnschedulable, o.reason)
			assert.Contains(t, o.message, tc.wantText)
			assert.Contains(t, o.message, "didn't match Pod's node affinity/selector")
		})
	}
}
