// Package validation holds the checks that decide whether a BuildJob can run and whether a
// BuildEnvironment describes a pod that could ever run. The admission webhooks, the
// JobSpawner, the BuildEnvironment controller (its Ready condition) and the pod builder all
// call it, so every place applies the same rules.
//
// The checks are pure functions: the caller passes what was looked up (the environment,
// the namespace's LimitRanges and environments). Admission does the lookups with a
// controller-runtime client.Reader and is the one entry to what the admission chain does
// to a new BuildJob: the webhooks call its Default and Check, each in its own admission
// request; the spawner, before it creates a BuildJob, calls Admit, the same two steps
// against one reading of the environment, so the two cannot drift apart:
//
//	verdict, err := admission.Admit(ctx, job) // err: a lookup failed; retry from a copy of job
//	if len(verdict.Problems) > 0 {
//		// write validation.ForPipelineAuthors(verdict.Problems) (and verdict.Warnings) into
//		// the job's log, finish it with agent_refused
//	}
//
// CacheFirst is the reader for callers on the hot path: BuildEnvironments from the
// manager's cache, and from the API server when the cache has not seen one yet, so that an
// environment created a moment ago is never reported missing.
//
// Messages that end up in a Buildkite log are written for pipeline authors: a missing or
// forbidden environment (EnvironmentProblem) lists the environments the pipeline may use
// and the nearest name, with no field paths or kubectl commands. Privileges lists what an
// environment may not do without spec.allow; EndpointAllowed which agent endpoints a
// BuildJob may send its token to.
//
// Some rules repeat what the CRD schema already enforces (absolute log paths, an image
// for the environment): the API server applies the schema before any validating webhook,
// so kubectl shows the schema's message for those, but the spawner validates before it
// ever talks to the API server and needs them here.
package validation

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Names the operator gives to parts of every job pod, from pkg/podcontract (which the pod
// builder and the in-pod supervisor share), so a BuildEnvironment cannot take one of them
// for its own containers, volumes or mount paths.
const (
	// ContainerJob is the container that runs the job's command.
	ContainerJob = podcontract.JobContainer
	// ContainerAgentdInstall is the init container that copies the supervisor into the pod.
	ContainerAgentdInstall = podcontract.InstallContainer
	// VolumeWorkspace is the volume shared by every container of the pod.
	VolumeWorkspace = podcontract.WorkspaceVolume
	// WorkspacePath is where VolumeWorkspace is mounted in every container.
	WorkspacePath = podcontract.WorkspaceDir
	// VolumeAgentdBin holds the supervisor binary for the job container.
	VolumeAgentdBin = podcontract.BinVolume
	// AgentdBinPath is where VolumeAgentdBin is mounted in the job container, or, with
	// image volumes, the folder under which both images' programs are.
	AgentdBinPath = podcontract.BinDir
	// VolumeHooks holds the ConfigMap of spec.agent.hooksConfigMap.
	VolumeHooks = podcontract.HooksVolume
	// ContainerAgentInstall is the init container that copies buildkite-agent from the
	// agent's image into the pod.
	ContainerAgentInstall = podcontract.AgentInstallContainer
	// VolumeGitSSH and VolumeGitCredentials hold the Secrets of spec.git.
	VolumeGitSSH         = podcontract.GitSSHVolume
	VolumeGitCredentials = podcontract.GitCredentialsVolume
	// VolumeSupervisorImage and VolumeAgentImage are the image volumes of the operator's
	// and the agent's images, when job pods mount their binaries from them.
	VolumeSupervisorImage = podcontract.SupervisorImageVolume
	VolumeAgentImage      = podcontract.AgentImageVolume
	// VolumeHandoff holds, in a warm pod (spec.warmPool), the projected token and the CA
	// bundle with which the pod's supervisor fetches its job from the operator.
	VolumeHandoff = "agentd-handoff"
	// HandoffPath is where VolumeHandoff is mounted in a warm pod's job container.
	HandoffPath = "/var/run/buildkite-operator/handoff"
)

// ReservedContainerNames are the container names a BuildEnvironment may not use.
var ReservedContainerNames = []string{ContainerJob, ContainerAgentdInstall, ContainerAgentInstall}

// ReservedVolumeNames are the volume names a BuildEnvironment may not use.
var ReservedVolumeNames = []string{VolumeWorkspace, VolumeAgentdBin, VolumeSupervisorImage, VolumeAgentImage, VolumeHooks, VolumeGitSSH, VolumeGitCredentials, VolumeHandoff}

// InvalidBuildJob turns errs into the error the API server would return for job, so that
// the spawner's message reads the same as kubectl's ("BuildJob.buildkite-operator.dev
// "x" is invalid: ..."). It returns nil when errs is empty.
func InvalidBuildJob(job *bkv1.BuildJob, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(bkv1.GroupVersion.WithKind("BuildJob").GroupKind(), job.Name, errs)
}

// InvalidBuildEnvironment is InvalidBuildJob for a BuildEnvironment.
func InvalidBuildEnvironment(env *bkv1.BuildEnvironment, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(bkv1.GroupVersion.WithKind("BuildEnvironment").GroupKind(), env.Name, errs)
}
