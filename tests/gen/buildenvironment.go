package gen

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// DefaultImage is the image of a BuildEnvironment that is given none.
const DefaultImage = "golang:1.26"

// BuildEnvironmentModifier changes a BuildEnvironment being built.
type BuildEnvironmentModifier func(*v1alpha1.BuildEnvironment)

// BuildEnvironment is a valid BuildEnvironment named name, running DefaultImage; then
// mods, in order. Everything else is left to the API's defaults: no namespace, runner,
// resources, timeouts or allowed pipelines unless a modifier gives them.
func BuildEnvironment(name string, mods ...BuildEnvironmentModifier) *v1alpha1.BuildEnvironment {
	be := &v1alpha1.BuildEnvironment{}
	be.Name = name
	be.Spec.Image = DefaultImage
	return apply(be, mods)
}

// BuildEnvironmentFrom is a copy of be changed by mods, in order; be is left as it is.
func BuildEnvironmentFrom(be *v1alpha1.BuildEnvironment, mods ...BuildEnvironmentModifier) *v1alpha1.BuildEnvironment {
	return apply(be.DeepCopy(), mods)
}

// SetBuildEnvironmentNamespace puts the BuildEnvironment in namespace ns.
func SetBuildEnvironmentNamespace(ns string) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Namespace = ns }
}

// SetBuildEnvironmentImage sets the image of the command container.
func SetBuildEnvironmentImage(image string) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Image = image }
}

// SetBuildEnvironmentImagePullPolicy sets the command container's pull policy.
func SetBuildEnvironmentImagePullPolicy(p corev1.PullPolicy) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.ImagePullPolicy = p }
}

// SetBuildEnvironmentRunner sets how the command runs.
func SetBuildEnvironmentRunner(r v1alpha1.RunnerMode) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Runner = r }
}

// SetBuildEnvironmentResources sets the command container's resources.
func SetBuildEnvironmentResources(r corev1.ResourceRequirements) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Resources = r }
}

// SetBuildEnvironmentMaxResources caps what a step may ask for.
func SetBuildEnvironmentMaxResources(l corev1.ResourceList) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.MaxResources = l }
}

// SetBuildEnvironmentTimeouts sets the default and the longest timeout, in minutes.
func SetBuildEnvironmentTimeouts(defaultMinutes, maxMinutes int32) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) {
		be.Spec.Timeouts = v1alpha1.Timeouts{DefaultMinutes: ptr.To(defaultMinutes), MaxMinutes: ptr.To(maxMinutes)}
	}
}

// SetBuildEnvironmentRetention sets how long finished pods and BuildJobs are kept.
func SetBuildEnvironmentRetention(r v1alpha1.Retention) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Retention = r }
}

// SetBuildEnvironmentAllowedPipelines sets the patterns of the pipelines that may use it.
func SetBuildEnvironmentAllowedPipelines(patterns ...string) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.AllowedPipelines = patterns }
}

// SetBuildEnvironmentAllowPrivileged lets its containers run privileged and mount host
// paths (spec.allow.privileged and spec.allow.hostPath).
func SetBuildEnvironmentAllowPrivileged(allow bool) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Allow.Privileged, be.Spec.Allow.HostPath = allow, allow }
}

// SetBuildEnvironmentAllow sets the privileges its pods may use.
func SetBuildEnvironmentAllow(a v1alpha1.Allow) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Allow = a }
}

// SetBuildEnvironmentSidecars sets the containers that run beside the command.
func SetBuildEnvironmentSidecars(c ...corev1.Container) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Sidecars = c }
}

// AddBuildEnvironmentVolume adds a pod volume, and mounts it in the command container.
func AddBuildEnvironmentVolume(v corev1.Volume, m corev1.VolumeMount) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) {
		be.Spec.Volumes = append(be.Spec.Volumes, v)
		be.Spec.VolumeMounts = append(be.Spec.VolumeMounts, m)
	}
}

// SetBuildEnvironmentTerminationGracePeriod sets how long a canceled job has between
// SIGTERM and SIGKILL.
func SetBuildEnvironmentTerminationGracePeriod(seconds int64) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.TerminationGracePeriodSeconds = ptr.To(seconds) }
}

// SetBuildEnvironmentWorkspace sets the /workspace volume.
func SetBuildEnvironmentWorkspace(w v1alpha1.Workspace) BuildEnvironmentModifier {
	return func(be *v1alpha1.BuildEnvironment) { be.Spec.Workspace = w }
}
