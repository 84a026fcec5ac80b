package podstate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
)

func TestPulledImage(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "job", Image: "golang:1.26", VolumeMounts: []corev1.VolumeMount{
			{Name: "workspace"}, {Name: "buildkite-agent-image"},
		}}},
		Volumes: []corev1.Volume{
			{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "buildkite-agent-image", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "buildkite/agent:nope"}}},
			{Name: "unmounted", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "elsewhere:1"}}},
		},
	}}
	cases := []struct{ name, message, want string }{
		{"the container's own image", `Back-off pulling image "golang:1.26": ErrImagePull`, "golang:1.26"},
		{"an image volume the container mounts", `Back-off pulling image "buildkite/agent:nope": ErrImagePull`, "buildkite/agent:nope"},
		{"an image volume it does not mount", `Failed to pull image "elsewhere:1": not found`, "golang:1.26"},
		{"no image named", "rpc error: code = NotFound", "golang:1.26"},
		{"a name that only starts like one", `Failed to pull image "buildkite/agent:nope-2": not found`, "golang:1.26"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, pulledImage(pod, "job", tc.message))
		})
	}
}
