package podbuilder

import (
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Binaries says how a job pod's container gets the supervisor (agentd-supervise, from the
// operator's image) and buildkite-agent (from the agent's image), which it runs whatever
// the job's own image holds.
type Binaries string

const (
	// BinariesInitContainer copies both into an emptyDir, one init container per image,
	// before the job's container starts. It works on every cluster, and costs each pod two
	// container starts more than its job needs.
	BinariesInitContainer Binaries = "init-container"
	// BinariesImageVolume mounts both images read-only as image volumes (Kubernetes'
	// ImageVolume, on by default from 1.35): no init container, nothing copied, the
	// kubelet pulls the images as for a container. The node's container runtime must have
	// image volumes (containerd 2.1, CRI-O 1.31 or later).
	BinariesImageVolume Binaries = "image-volume"
)

// DefaultBinaries works everywhere; the operator picks image volumes where the cluster has
// them (pkg/imagevolume).
const DefaultBinaries = BinariesInitContainer

// podBinaries is what the pod's binaries take: its init containers, its volumes, the job
// container's mounts, and where the job container finds them.
type podBinaries struct {
	initContainers []corev1.Container
	volumes        []corev1.Volume
	mounts         []corev1.VolumeMount
	// supervisor is the job container's command.
	supervisor string
	// binPath is the folder of buildkite-agent (the job's BUILDKITE_BIN_PATH).
	binPath string
}

// binariesOf says how the pod of env gets its binaries under opts (whose defaults are set).
func binariesOf(env *bkv1.BuildEnvironment, opts Options, workspaceMount corev1.VolumeMount) podBinaries {
	agentImage, agentPolicy := agentImageOf(env, opts)
	if opts.Binaries == BinariesImageVolume {
		return podBinaries{
			volumes: []corev1.Volume{
				imageVolume(podcontract.SupervisorImageVolume, opts.OperatorImage, opts.OperatorImagePullPolicy),
				imageVolume(podcontract.AgentImageVolume, agentImage, agentPolicy),
			},
			mounts: []corev1.VolumeMount{
				imageBinMount(podcontract.SupervisorImageVolume, podcontract.SupervisorImageDir),
				imageBinMount(podcontract.AgentImageVolume, podcontract.AgentImageDir),
			},
			supervisor: podcontract.SupervisorImageDir + "/agentd-supervise",
			binPath:    podcontract.AgentImageDir,
		}
	}
	binMount := corev1.VolumeMount{Name: podcontract.BinVolume, MountPath: podcontract.BinDir}
	install := corev1.Container{
		Name:                     podcontract.InstallContainer,
		Image:                    opts.OperatorImage,
		ImagePullPolicy:          opts.OperatorImagePullPolicy,
		Args:                     []string{"install", "--supervisor", podcontract.ImageSupervisorPath, podcontract.SupervisorPath},
		VolumeMounts:             []corev1.VolumeMount{binMount, workspaceMount},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	return podBinaries{
		initContainers: []corev1.Container{install, agentInstall(agentImage, agentPolicy, binMount, workspaceMount)},
		volumes:        []corev1.Volume{{Name: podcontract.BinVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		mounts:         []corev1.VolumeMount{{Name: podcontract.BinVolume, MountPath: podcontract.BinDir, ReadOnly: true}},
		supervisor:     podcontract.SupervisorPath,
		binPath:        podcontract.BinDir,
	}
}

// agentImageOf is the image env's jobs get buildkite-agent from, and its pull policy: the
// environment's spec.agent, else the operator's.
func agentImageOf(env *bkv1.BuildEnvironment, opts Options) (string, corev1.PullPolicy) {
	image, policy := opts.AgentImage, opts.AgentImagePullPolicy
	if a := &env.Spec.Agent; a.Image != "" {
		image = a.Image
	}
	if p := env.Spec.Agent.ImagePullPolicy; p != "" {
		policy = p
	}
	return image, policy
}

func imageVolume(name, image string, policy corev1.PullPolicy) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		Image: &corev1.ImageVolumeSource{Reference: image, PullPolicy: policy},
	}}
}

func imageBinMount(volume, dir string) corev1.VolumeMount {
	return corev1.VolumeMount{Name: volume, MountPath: dir, SubPath: podcontract.ImageBinDir, ReadOnly: true}
}
