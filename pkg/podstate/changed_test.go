package podstate_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

func TestStateChanged(t *testing.T) {
	pod := func(name string) *corev1.Pod { p, _ := fixture(t, name); return p }
	edit := func(name string, change func(*corev1.Pod)) *corev1.Pod {
		p := pod(name)
		change(p)
		return p
	}
	cases := []struct {
		name     string
		old, new *corev1.Pod
		want     bool
	}{
		{"the same pod", pod("running"), pod("running"), false},
		{"pulling, then the pull fails", pod("pulling"), pod("err-image-pull"), true},
		{"the pull fails, then backs off", pod("err-image-pull"), pod("image-pull-backoff"), true},
		{"running, then the command ended", pod("running"), pod("exited"), true},
		{"waiting for a node, then scheduled", pod("unschedulable"), edit("unschedulable", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}
			p.Spec.NodeName = "node-1"
		}), true},
		{"still unschedulable, with another message", pod("unschedulable"), edit("unschedulable", func(p *corev1.Pod) {
			for i := range p.Status.Conditions {
				p.Status.Conditions[i].Message = "0/3 nodes are available: 3 Insufficient memory."
				p.Status.Conditions[i].LastProbeTime = metav1.NewTime(time.Now())
			}
		}), false},
		{"bound to a node, nothing else", edit("pulling", func(p *corev1.Pod) { p.Spec.NodeName = "" }), pod("pulling"), false},
		{"running, now ready", pod("running"), edit("running", func(p *corev1.Pod) {
			p.ResourceVersion = "999"
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
		}), false},
		{"running, then deleted", pod("running"), edit("running", func(p *corev1.Pod) {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}), true},
		{"running, then a disruption target", pod("running"), edit("running", func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"})
		}), true},
		{"a container restarted", pod("sidecar-crash-loop"), edit("sidecar-crash-loop", func(p *corev1.Pod) {
			for i := range p.Status.ContainerStatuses {
				p.Status.ContainerStatuses[i].RestartCount++
			}
		}), true},
		{"evicted", pod("running"), pod("evicted-node-pressure"), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, podstate.StateChanged(tc.old, tc.new))
		})
	}
}
