package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// RunnerMode says how the job's command runs inside its container.
// +kubebuilder:validation:Enum=Command;Bootstrap
type RunnerMode string

const (
	// RunnerCommand: the supervisor checks out BUILDKITE_REPO (when given) and runs the
	// command under /bin/sh -e -c. The image needs only a shell (and git to check out). It
	// runs no plugins (other than the operator's own), hooks or artifact_paths: a step that
	// asks for them is refused when it is accepted.
	RunnerCommand RunnerMode = podcontract.RunnerCommand
	// RunnerBootstrap: the supervisor runs `buildkite-agent bootstrap`, so checkout, hooks,
	// plugins, meta-data, artifacts and pipeline upload work as on any agent. The operator
	// brings buildkite-agent into every pod: the image needs only a shell (and git to check
	// out).
	RunnerBootstrap RunnerMode = podcontract.RunnerBootstrap

	// DefaultRunner is the runner of an environment that names none: the value of the
	// +kubebuilder:default marker on BuildEnvironmentSpec.Runner, which must stay the same.
	DefaultRunner RunnerMode = podcontract.DefaultRunner
)

// ConditionReady is the BuildEnvironment condition that says whether jobs can use it:
// True (ReasonEnvironmentValid) when it passes the checks the webhook runs, False
// (ReasonEnvironmentInvalid) with the problems in its message when it does not.
const ConditionReady = "Ready"

// Reasons of the Ready condition.
const (
	ReasonEnvironmentValid   = "Valid"
	ReasonEnvironmentInvalid = "Invalid"
)

// Workspace is the volume mounted at /workspace in every container of a job's pod.
// +kubebuilder:validation:XValidation:rule="!(has(self.emptyDir) && has(self.volumeClaimTemplate))",message="workspace takes either emptyDir or volumeClaimTemplate, not both"
type Workspace struct {
	// EmptyDir is the default: a fresh directory for each job.
	// +optional
	EmptyDir *corev1.EmptyDirVolumeSource `json:"emptyDir,omitempty"`
	// VolumeClaimTemplate makes a PersistentVolumeClaim for each job, owned by its pod.
	// +optional
	VolumeClaimTemplate *corev1.PersistentVolumeClaimTemplate `json:"volumeClaimTemplate,omitempty"`
}

// Timeouts bound how long jobs in the environment run.
// +kubebuilder:validation:XValidation:rule="!has(self.defaultMinutes) || !has(self.maxMinutes) || self.defaultMinutes <= self.maxMinutes",message="timeouts.defaultMinutes must not exceed timeouts.maxMinutes"
type Timeouts struct {
	// DefaultMinutes applies to jobs whose step sets no timeout.
	// +kubebuilder:validation:Minimum=1
	// +optional
	DefaultMinutes *int32 `json:"defaultMinutes,omitempty"`
	// MaxMinutes is the longest timeout a step may ask for.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxMinutes *int32 `json:"maxMinutes,omitempty"`
}

// Retention says how long finished jobs leave things behind.
type Retention struct {
	// SucceededPods: how long the pod of a passed job is kept after it is reported. Default 0.
	// +optional
	SucceededPods *metav1.Duration `json:"succeededPods,omitempty"`
	// FailedPods: how long the pod of a failed job is kept, for debugging. Default 10m.
	// +optional
	FailedPods *metav1.Duration `json:"failedPods,omitempty"`
	// BuildJobs: how long a reported BuildJob is kept. Default 1h.
	// +optional
	BuildJobs *metav1.Duration `json:"buildJobs,omitempty"`
}

// BuildEnvironmentSpec is how the pods of the jobs that choose this environment are built.
type BuildEnvironmentSpec struct {
	// Image of the container that runs the job's command.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="!self.contains(' ')",message="image must not contain spaces; give a reference such as golang:1.26 or registry.example.com/ci/go@sha256:..."
	Image string `json:"image"`
	// ImagePullPolicy of the command container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Runner says how the command runs: Bootstrap (DefaultRunner: buildkite-agent
	// bootstrap, as on any agent) or Command (the command alone under /bin/sh).
	// +kubebuilder:default=Bootstrap
	// +optional
	Runner RunnerMode `json:"runner,omitempty"`
	// Resources of the command container, unless the step asks for others.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// MaxResources caps what a step may ask for.
	// +optional
	MaxResources corev1.ResourceList `json:"maxResources,omitempty"`
	// Env of the command container, added to the job's own env.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// EnvFrom of the command container.
	// +optional
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`
	// VolumeMounts of the command container; /workspace is always mounted.
	// +optional
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	// SecurityContext of the command container.
	// +optional
	SecurityContext *corev1.SecurityContext `json:"securityContext,omitempty"`
	// Sidecars run beside the command (databases, caches, ...), as native sidecars,
	// so that the pod ends when the command does.
	// +optional
	Sidecars []corev1.Container `json:"sidecars,omitempty"`
	// InitContainers run, in order, before the command.
	// +optional
	InitContainers []corev1.Container `json:"initContainers,omitempty"`
	// Volumes of the pod, for the containers' volumeMounts.
	// +optional
	Volumes []corev1.Volume `json:"volumes,omitempty"`
	// Workspace is the /workspace volume; an emptyDir unless set.
	// +optional
	Workspace Workspace `json:"workspace,omitempty"`
	// ServiceAccountName the pod runs as; needs allow.serviceAccount.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// AutomountServiceAccountToken gives the job's containers a Kubernetes API token;
	// needs allow.serviceAccount. Jobs get none unless this is true.
	// +optional
	AutomountServiceAccountToken bool `json:"automountServiceAccountToken,omitempty"`
	// NodeSelector of the pod.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the pod; each taint key needs allow.tolerations.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity of the pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// PodSecurityContext of the pod.
	// +optional
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
	// ImagePullSecrets of the pod.
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// PriorityClassName of the pod; needs allow.priorityClasses.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// PodLabels are added to the pod's labels.
	// +optional
	PodLabels map[string]string `json:"podLabels,omitempty"`
	// PodAnnotations are added to the pod's annotations.
	// +optional
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`
	// TerminationGracePeriodSeconds is how long the pod has to end once it is deleted. A
	// canceled job has this, less a few seconds, between SIGTERM and SIGKILL, unless
	// agent.cancelGracePeriodSeconds says otherwise. Default 30, or
	// agent.cancelGracePeriodSeconds and a few seconds when that is longer.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
	// Timeouts of jobs in this environment.
	// +optional
	Timeouts Timeouts `json:"timeouts,omitempty"`
	// Retention of finished pods and BuildJobs.
	// +optional
	Retention Retention `json:"retention,omitempty"`
	// AllowedPipelines are glob patterns (path.Match syntax, such as "payments-*") of
	// the pipeline slugs that may use this environment. Empty allows every pipeline.
	// +kubebuilder:validation:XValidation:rule="self.all(p, size(p) > 0)",message="allowedPipelines entries must not be empty; use \"*\" to allow every pipeline"
	// +optional
	AllowedPipelines []string `json:"allowedPipelines,omitempty"`
	// Allow lists the privileges this environment's pods may use; each is refused unless
	// allowed here.
	// +optional
	Allow Allow `json:"allow,omitempty"`
	// Agent holds the settings of buildkite-agent that the environment's jobs run with, as
	// `buildkite-agent start` would give them. Unset settings are the agent's defaults.
	// +optional
	Agent AgentSettings `json:"agent,omitempty"`
	// Git gives the checkouts of the environment's jobs credentials for private
	// repositories: an SSH key, and credentials for https, each from a Secret of the
	// environment's namespace that spec.allow.secrets lists.
	// +optional
	Git GitSettings `json:"git,omitempty"`
	// WarmPool keeps pods of this environment running before any job needs them, so that
	// a job starts in a pod that is already up. None unless set.
	// +optional
	WarmPool *WarmPool `json:"warmPool,omitempty"`
}

// EffectiveRunner is the runner of the environment's jobs: spec.runner, or DefaultRunner for
// an environment that the API server has not defaulted (one made in Go).
func (s *BuildEnvironmentSpec) EffectiveRunner() RunnerMode {
	if s.Runner == "" {
		return DefaultRunner
	}
	return s.Runner
}

// BuildEnvironmentStatus says whether the environment is usable.
type BuildEnvironmentStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, with a reason and message when it is not.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// WarmPool is what the environment's warm pool holds, while it has spec.warmPool.
	// +optional
	WarmPool *WarmPoolStatus `json:"warmPool,omitempty"`
}

// BuildEnvironment is how the pods of the jobs that choose it are built.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=benv,categories=buildkite
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Runner",type=string,JSONPath=`.spec.runner`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BuildEnvironment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BuildEnvironmentSpec   `json:"spec"`
	Status BuildEnvironmentStatus `json:"status,omitempty"`
}

// BuildEnvironmentList is a list of BuildEnvironments.
// +kubebuilder:object:root=true
type BuildEnvironmentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BuildEnvironment `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BuildEnvironment{}, &BuildEnvironmentList{})
}
