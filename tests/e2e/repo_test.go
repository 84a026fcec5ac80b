package e2e

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// repoMount is where pods see the host's repository. Pods on the one local node reach it
// through a hostPath volume: simpler than a git server, and git clones a path as it clones
// a URL.
const repoMount = "/srv/repo"

// repoEnvironment mounts the host's repository; hostPath needs allowPrivileged.
func repoEnvironment(name string, bootstrap bool) *bkv1.BuildEnvironment {
	be := &bkv1.BuildEnvironment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: bkv1.BuildEnvironmentSpec{
			Image:           images.JobImage,
			ImagePullPolicy: corev1.PullNever,
			AllowPrivileged: true,
			Volumes: []corev1.Volume{{Name: "repo", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: repo.Dir},
			}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "repo", MountPath: repoMount, ReadOnly: true}},
		},
	}
	if bootstrap {
		be.Spec.Runner = bkv1.RunnerBootstrap
	}
	return be
}
