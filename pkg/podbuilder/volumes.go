package podbuilder

import (
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// podVolumes are the pod's volumes: the workspace and those of the binaries (bins), the
// environment's own, then the agent's and spec.git's.
func podVolumes(env *bkv1.BuildEnvironment, bins podBinaries) []corev1.Volume {
	volumes := append([]corev1.Volume{workspaceVolume(env)}, bins.volumes...)
	for _, v := range env.Spec.Volumes {
		volumes = append(volumes, *v.DeepCopy())
	}
	volumes = append(volumes, agentVolumes(env)...)
	volumes = append(volumes, gitVolumes(env)...)
	return volumes
}

// withWorkspace adds the /workspace mount unless the container already mounts the
// workspace volume.
func withWorkspace(mounts []corev1.VolumeMount, ws corev1.VolumeMount) []corev1.VolumeMount {
	for _, m := range mounts {
		if m.Name == ws.Name {
			return mounts
		}
	}
	return append([]corev1.VolumeMount{ws}, mounts...)
}

func workspaceVolume(env *bkv1.BuildEnvironment) corev1.Volume {
	ws := env.Spec.Workspace
	v := corev1.Volume{Name: podcontract.WorkspaceVolume}
	switch {
	case ws.VolumeClaimTemplate != nil:
		// A generic ephemeral volume: Kubernetes makes the claim, owned by the pod, and
		// deletes it with the pod.
		v.Ephemeral = &corev1.EphemeralVolumeSource{VolumeClaimTemplate: ws.VolumeClaimTemplate.DeepCopy()}
	case ws.EmptyDir != nil:
		v.EmptyDir = ws.EmptyDir.DeepCopy()
	default:
		v.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	return v
}
