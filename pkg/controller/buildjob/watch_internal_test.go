package buildjob

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

func TestPodEvents(t *testing.T) {
	pod := func(held bool, state corev1.ContainerState, change ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "node-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: podcontract.JobContainer, State: state}}}}
		if held {
			p.Finalizers = []string{podbuilder.PodFinalizer}
		}
		for _, c := range change {
			c(p)
		}
		return p
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	ended := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
	deleted := func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }
	ready := func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	unbound := func(p *corev1.Pod) {
		p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses = "", corev1.PodPending, nil
	}
	unschedulable := func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	}
	cases := []struct {
		name     string
		old, new *corev1.Pod
		want     bool
	}{
		{"the command ended", pod(true, running), pod(true, ended), true},
		{"a running pod became ready", pod(true, running), pod(true, running, ready), false},
		{"a running pod is deleted", pod(true, running), pod(true, running, deleted), true},
		{"someone let go of a running pod", pod(true, running), pod(false, running), true},
		{"the operator let go of an ended pod", pod(true, ended), pod(false, ended), false},
		{"an ended pod let go of is deleted", pod(false, ended), pod(false, ended, deleted), false},
		// The pods of jobs the operator accepted are never held (podbuilder.PodFinalizer).
		{"the command of a pod never held ended", pod(false, running), pod(false, ended), true},
		{"a running pod never held is deleted", pod(false, running), pod(false, running, deleted), true},
		{"a pod never held on no node is unschedulable", pod(false, corev1.ContainerState{}, unbound), pod(false, corev1.ContainerState{}, unbound, unschedulable), true},
		{"an ended pod never held is deleted", pod(false, ended), pod(false, ended, deleted), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, podEvents.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}))
		})
	}
	assert.False(t, podEvents.Create(event.CreateEvent{Object: pod(true, corev1.ContainerState{})}), "the reconcile that creates a pod asks to look again")
	assert.True(t, podEvents.Delete(event.DeleteEvent{Object: pod(false, running)}), "a pod gone while its command could run")
	assert.False(t, podEvents.Delete(event.DeleteEvent{Object: pod(false, ended)}), "an ended pod's deletion")
}

func TestTokenSecretEvents(t *testing.T) {
	secret := func(token, seal string) *corev1.Secret {
		return &corev1.Secret{Data: map[string][]byte{bkv1.DefaultSecretKey: []byte(token), bkv1.TokenSecretSealKey: []byte(seal)}}
	}
	assert.True(t, tokenSecretEvents.Create(event.CreateEvent{Object: secret("t", "s")}), "a BuildJob may wait for its Secret")
	assert.True(t, tokenSecretEvents.Update(event.UpdateEvent{ObjectOld: secret("t", ""), ObjectNew: secret("t", "s")}), "sealed now")
	assert.False(t, tokenSecretEvents.Update(event.UpdateEvent{ObjectOld: secret("t", "s"), ObjectNew: secret("t", "s")}), "nothing the controller reads changed")
	assert.False(t, tokenSecretEvents.Delete(event.DeleteEvent{Object: secret("t", "s")}))
}
