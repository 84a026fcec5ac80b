package buildjob

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// TestTrimTokenSecret: the cached token Secret keeps the token and what its events need
// (its owner: Setup's Owns enqueues the BuildJob from it), and nothing else of the Secret.
func TestTrimTokenSecret(t *testing.T) {
	yes := true
	owner := metav1.OwnerReference{APIVersion: bkv1.GroupVersion.String(), Kind: "BuildJob", Name: "j", UID: "u", Controller: &yes}
	in := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "j-token", Namespace: "ns", Labels: map[string]string{bkv1.LabelJob: "j"},
			OwnerReferences: []metav1.OwnerReference{owner},
			Annotations:     map[string]string{"a": "b"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "spawner"}},
		},
		Data: map[string][]byte{bkv1.DefaultSecretKey: []byte("bkaj_x"), "env-DB_PASSWORD": []byte("hunter2")},
	}
	out, err := trimTokenSecret(in)
	require.NoError(t, err)
	s := out.(*corev1.Secret)
	assert.Equal(t, map[string][]byte{bkv1.DefaultSecretKey: []byte("bkaj_x")}, s.Data, "the token only: the job's env stays out of the operator's memory")
	assert.Equal(t, []metav1.OwnerReference{owner}, s.OwnerReferences)
	assert.Equal(t, in.Labels, s.Labels)
	assert.Empty(t, s.Annotations)
	assert.Empty(t, s.ManagedFields)
}

// TestTrimPod: the cached pod keeps what the controller reads (status, node, each
// container's name, image, resources and restart policy, the grace period and deadline,
// the finalizers it patches away) and drops what its containers are told.
func TestTrimPod(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	grace, deadline := int64(30), int64(600)
	container := func(name string, restart *corev1.ContainerRestartPolicy) corev1.Container {
		return corev1.Container{
			Name: name, Image: name + ":1", RestartPolicy: restart,
			Resources:    corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
			Env:          []corev1.EnvVar{{Name: "BUILDKITE_JOB_ID", Value: "j"}},
			EnvFrom:      []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "j-env"}}}},
			Command:      []string{"/agentd/agentd-supervise"},
			Args:         []string{"--finish-flushed"},
			VolumeMounts: []corev1.VolumeMount{{Name: "workspace", MountPath: "/workspace"}},
		}
	}
	in := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "j", Namespace: "ns", Labels: map[string]string{bkv1.LabelJob: "j"},
			Finalizers:    []string{"buildkite-operator.dev/outcome"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "operator"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-1", TerminationGracePeriodSeconds: &grace, ActiveDeadlineSeconds: &deadline,
			InitContainers: []corev1.Container{container("agentd-install", nil), container("sidecar", &always)},
			Containers:     []corev1.Container{container("job", nil)},
			Volumes:        []corev1.Volume{{Name: "workspace"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Message: "m"},
	}
	want := in.DeepCopy()
	want.ManagedFields, want.Spec.Volumes = nil, nil
	for _, list := range [][]corev1.Container{want.Spec.InitContainers, want.Spec.Containers} {
		for i := range list {
			list[i].Env, list[i].EnvFrom, list[i].Command, list[i].Args, list[i].VolumeMounts = nil, nil, nil, nil, nil
		}
	}
	out, err := trimPod(in)
	require.NoError(t, err)
	assert.Equal(t, want, out)
}
