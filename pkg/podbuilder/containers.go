package podbuilder

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// initContainers are the pod's init containers in the order they start: those that bring
// the binaries (bins), the environment's own init containers, then its sidecars; each of
// the environment's mounts the workspace.
func initContainers(env *bkv1.BuildEnvironment, bins podBinaries, workspaceMount corev1.VolumeMount) []corev1.Container {
	s := &env.Spec
	initContainers := slices.Clone(bins.initContainers)
	for _, c := range s.InitContainers {
		c = *c.DeepCopy()
		c.VolumeMounts = withWorkspace(c.VolumeMounts, workspaceMount)
		initContainers = append(initContainers, c)
	}
	always := corev1.ContainerRestartPolicyAlways
	for _, c := range s.Sidecars {
		c = *c.DeepCopy()
		// A native sidecar: started before the command, stopped after it, and never
		// keeping the pod alive once the command has ended.
		c.RestartPolicy = &always
		c.VolumeMounts = withWorkspace(c.VolumeMounts, workspaceMount)
		initContainers = append(initContainers, c)
	}
	return initContainers
}

// jobContainer is the container that runs the job's command in the environment's image,
// under the supervisor the install init container put in the bin volume. With a nil job it
// is a warm pod's (see build): the environment's env and resources only.
func jobContainer(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, bins podBinaries, signalGrace time.Duration, workspaceMount corev1.VolumeMount) corev1.Container {
	s := &env.Spec
	mounts := append([]corev1.VolumeMount{workspaceMount}, bins.mounts...)
	for _, m := range s.VolumeMounts {
		mounts = append(mounts, *m.DeepCopy())
	}
	mounts = append(mounts, agentMounts(env)...)
	mounts = append(mounts, gitMounts(env)...)

	return corev1.Container{
		Name:            podcontract.JobContainer,
		Image:           s.Image,
		ImagePullPolicy: s.ImagePullPolicy,
		// The supervisor finishes the job itself once its output is sent: the
		// fastest finish, one call, and no status write in between.
		Command:         []string{bins.supervisor, "--" + podcontract.FinishFlushedFlag},
		WorkingDir:      podcontract.WorkspaceDir,
		Env:             jobEnv(job, env, opts, bins.binPath, signalGrace),
		EnvFrom:         deepCopyEnvFrom(s.EnvFrom),
		Resources:       validation.EffectiveResources(jobResources(job), &s.Resources),
		VolumeMounts:    mounts,
		SecurityContext: s.SecurityContext.DeepCopy(),
		// The supervisor keeps its progress here; File (not FallbackToLogsOnError) so
		// that the job's own output is never mistaken for it.
		TerminationMessagePath:   jobprogress.DefaultPath,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
}

// jobResources are the resources job asks for: none for a warm pod (a nil job).
func jobResources(job *bkv1.BuildJob) *corev1.ResourceRequirements {
	if job == nil {
		return nil
	}
	return job.Spec.Resources
}

func deepCopyEnvFrom(in []corev1.EnvFromSource) []corev1.EnvFromSource {
	if in == nil {
		return nil
	}
	out := make([]corev1.EnvFromSource, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}
