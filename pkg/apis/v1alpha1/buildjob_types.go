package v1alpha1

import (
	"encoding/hex"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels the spawner puts on every BuildJob (and the controller copies onto its pod),
// so that `kubectl get bj -l buildkite-operator.dev/pipeline=my-app` finds them.
const (
	LabelPipeline = "buildkite-operator.dev/pipeline"
	LabelBuild    = "buildkite-operator.dev/build"
	LabelStep     = "buildkite-operator.dev/step"
	LabelJob      = "buildkite-operator.dev/job"
	// LabelEnvironment names the BuildEnvironment a BuildJob runs in.
	LabelEnvironment = "buildkite-operator.dev/environment"
)

// AnnotationAcceptedAt is when the spawner accepted the job (RFC 3339, nanoseconds),
// set as it creates the BuildJob: a status cannot be written with the create, and a
// status update only for this time would be one more write per job. The controller
// copies it into status.times.acceptedAt with its first status update.
const AnnotationAcceptedAt = "buildkite-operator.dev/accepted-at"

// AnnotationIntake marks a BuildJob the spawner made for a Buildkite job: its value is
// the intake's nonce, drawn when the job was offered and kept in the slot's state, where
// job namespaces' users cannot read it. A BuildJob with it waits for its sealed token
// Secret (TokenSecretSealKey) and never runs without one; the webhook lets only the
// operator set it. A BuildJob without it is made by hand: it gets no job from Buildkite.
const AnnotationIntake = "buildkite-operator.dev/intake"

// AnnotationStopReason, on a BuildJob, says why whoever deletes it does, so that the job's
// log can say why the operator stopped the job. `agentd drain` (the chart's uninstall hook)
// sets StopReasonUninstall before it deletes the BuildJobs; any other value, or none, is
// a BuildJob deleted by hand.
const (
	AnnotationStopReason = "buildkite-operator.dev/stop-reason"
	StopReasonUninstall  = "uninstall"
)

// TokenSecretSealKey is the key, in a BuildJob's token Secret, of the seal that proves
// the spawner made the Secret for that BuildJob (pkg/seal). The controller uses the job
// token, and builds a pod that reads it, only from a Secret so sealed.
const TokenSecretSealKey = "seal"

// FinishFinalizer keeps a BuildJob until Buildkite has been told how its job ended. The
// spawner creates BuildJobs with it already set, so that a BuildJob deleted before the
// controller first sees it still has its job finished; the controller removes it.
const FinishFinalizer = "buildkite-operator.dev/finish"

// BuildJobPhase is where a BuildJob is in its life.
// +kubebuilder:validation:Enum=Pending;Scheduled;Running;Succeeded;Failed;Canceled
type BuildJobPhase string

const (
	// PhasePending: accepted from Buildkite; the pod does not exist or is not yet scheduled.
	PhasePending BuildJobPhase = "Pending"
	// PhaseScheduled: the pod is bound to a node; images are pulling or containers starting.
	PhaseScheduled BuildJobPhase = "Scheduled"
	// PhaseRunning: the job's command is running.
	PhaseRunning BuildJobPhase = "Running"
	// PhaseSucceeded: the job finished with exit status 0. The terminal phases are set
	// with the outcome; the Reported condition says whether Buildkite has been told.
	PhaseSucceeded BuildJobPhase = "Succeeded"
	// PhaseFailed: the job finished with a non-zero exit status, or never ran.
	PhaseFailed BuildJobPhase = "Failed"
	// PhaseCanceled: the job was canceled or timed out on Buildkite, or its BuildJob was deleted.
	PhaseCanceled BuildJobPhase = "Canceled"
)

// Finished reports whether p is a terminal phase.
func (p BuildJobPhase) Finished() bool {
	return p == PhaseSucceeded || p == PhaseFailed || p == PhaseCanceled
}

// DefaultSecretKey is the key a SecretKeyRef names when it names none: the value of the
// +kubebuilder:default marker on SecretKeyRef.Key, which must stay the same.
const DefaultSecretKey = "token"

// EnvSecretKey is the key, in a BuildJob's token Secret, of the value of the job
// environment variable name that spec.envNames lists: "env." and the name when the name is
// made of the characters a Secret key allows (letters, digits, '-', '_' and '.'), which
// every usual variable name is; else "env-hex." and the name in hexadecimal. The two
// prefixes differ, so no two names share a key. A Secret key is at most 253 characters.
func EnvSecretKey(name string) string {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "env-hex." + hex.EncodeToString([]byte(name))
		}
	}
	return "env." + name
}

// KeyOrDefault is the key the reference names, or DefaultSecretKey.
func (r SecretKeyRef) KeyOrDefault() string {
	if r.Key == "" {
		return DefaultSecretKey
	}
	return r.Key
}

// SecretKeyRef names one key of a Secret in the BuildJob's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key within the Secret; DefaultSecretKey when empty.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:default=token
	// +optional
	Key string `json:"key,omitempty"`
}

// LogLimits are the log-chunk limits Buildkite gave the job when it was accepted.
type LogLimits struct {
	// ChunksMaxSizeBytes is the largest uncompressed log chunk Buildkite accepts.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ChunksMaxSizeBytes int64 `json:"chunksMaxSizeBytes,omitempty"`
	// ChunksIntervalSeconds is how often buffered output is sent.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ChunksIntervalSeconds int32 `json:"chunksIntervalSeconds,omitempty"`
	// LogMaxSizeBytes is the most log Buildkite keeps for the job.
	// +kubebuilder:validation:Minimum=1
	// +optional
	LogMaxSizeBytes int64 `json:"logMaxSizeBytes,omitempty"`
}

// BuildJobSpec is everything needed to run one Buildkite job and report its result.
// It is written once, by the spawner, when the job is accepted.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: a BuildJob is one accepted Buildkite job; retry the job in Buildkite instead of editing it"
type BuildJobSpec struct {
	// JobID is the Buildkite job UUID.
	// +kubebuilder:validation:Pattern=`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
	JobID string `json:"jobID"`
	// OrganizationSlug is the Buildkite organization the job belongs to.
	// +optional
	OrganizationSlug string `json:"organizationSlug,omitempty"`
	// PipelineSlug is the pipeline the job belongs to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9-_]*$`
	PipelineSlug string `json:"pipelineSlug"`
	// BuildID is the Buildkite build UUID.
	// +optional
	BuildID string `json:"buildID,omitempty"`
	// BuildNumber is the build's number within its pipeline.
	// +kubebuilder:validation:Minimum=1
	BuildNumber int64 `json:"buildNumber"`
	// BuildURL links to the build on Buildkite.
	// +kubebuilder:validation:XValidation:rule="self == '' || self.startsWith('https://') || self.startsWith('http://')",message="buildURL must be an http(s) URL"
	// +optional
	BuildURL string `json:"buildURL,omitempty"`
	// StepKey is the step's key, when the pipeline gave it one.
	// +optional
	StepKey string `json:"stepKey,omitempty"`
	// Label is the step's label as Buildkite shows it.
	// +optional
	Label string `json:"label,omitempty"`
	// Command is the step's command; several commands are joined by newlines, as Buildkite does.
	// +optional
	Command string `json:"command,omitempty"`
	// AgentTags are the step's agent query rules (for example queue=bk-operator).
	// +optional
	AgentTags map[string]string `json:"agentTags,omitempty"`
	// Env is job environment given in clear, as a BuildJob made by hand may give it. The
	// spawner leaves it empty: a pipeline's env holds secrets, so it keeps the job's
	// environment in the token Secret and lists only the names, in envNames.
	// +kubebuilder:validation:MaxProperties=2000
	// +kubebuilder:validation:XValidation:rule="!('BUILDKITE_AGENT_ACCESS_TOKEN' in self) && !('BUILDKITE_AGENT_TOKEN' in self)",message="tokens must not be put in env: reference the job token through tokenSecretRef"
	// +optional
	Env map[string]string `json:"env,omitempty"`
	// EnvNames are the names of job environment variables whose values are kept in the
	// token Secret (tokenSecretRef.name), each under the key EnvSecretKey(name): "env."
	// and the name. The pod takes each value from the Secret, so the values show neither
	// here nor in the pod spec. A name also in env takes its value from the Secret.
	// +kubebuilder:validation:MaxItems=2000
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.exists(n, n == 'BUILDKITE_AGENT_ACCESS_TOKEN' || n == 'BUILDKITE_AGENT_TOKEN')",message="tokens must not be put in envNames: reference the job token through tokenSecretRef"
	// +listType=set
	// +optional
	EnvNames []string `json:"envNames,omitempty"`
	// BuildEnvironment names the BuildEnvironment, in this namespace, the job runs in.
	// The mutating webhook fills in the operator's default when it is empty.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	BuildEnvironment string `json:"buildEnvironment,omitempty"`
	// LogPaths are absolute paths of files in the job's container whose content is
	// streamed into the Buildkite log as they grow.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.all(p, p.startsWith('/'))",message="logPaths must be absolute paths, such as /workspace/service.log"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !p.matches('(^|/)[.][.](/|$)'))",message="logPaths must not contain '..': name the file by its absolute path"
	// +optional
	LogPaths []string `json:"logPaths,omitempty"`
	// TimeoutMinutes bounds how long the job may run; past it the job is canceled.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10080
	// +optional
	TimeoutMinutes *int32 `json:"timeoutMinutes,omitempty"`
	// Resources the step asked for, within what its BuildEnvironment allows.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// TokenSecretRef names the Secret key holding the job token Buildkite issued.
	TokenSecretRef SecretKeyRef `json:"tokenSecretRef"`
	// AgentEndpoint is the Buildkite agent API base URL the job reports to.
	// +kubebuilder:validation:XValidation:rule="self.startsWith('https://') || self.startsWith('http://')",message="agentEndpoint must be an http(s) URL such as https://agent.buildkite.com/v3"
	// +optional
	AgentEndpoint string `json:"agentEndpoint,omitempty"`
	// LogLimits are the log-chunk limits Buildkite set for the job.
	// +optional
	LogLimits LogLimits `json:"logLimits,omitempty"`
}

// LogProgress counts the job's output sent to Buildkite.
type LogProgress struct {
	// Bytes of output Buildkite has acknowledged.
	Bytes int64 `json:"bytes,omitempty"`
	// Chunks Buildkite has acknowledged.
	Chunks int64 `json:"chunks,omitempty"`
	// FailedChunks Buildkite refused; their content is missing from the log.
	FailedChunks int64 `json:"failedChunks,omitempty"`
}

// BuildJobTimes records when each step of the job's life happened.
type BuildJobTimes struct {
	// AcceptedAt: the spawner accepted the job from Buildkite.
	AcceptedAt *metav1.Time `json:"acceptedAt,omitempty"`
	// PodCreatedAt: the controller created the job's pod.
	PodCreatedAt *metav1.Time `json:"podCreatedAt,omitempty"`
	// StartedAt: the job's command started.
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// FinishedAt: the job's command ended, or the job was given up.
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
	// ReportedAt: Buildkite accepted the job's finish.
	ReportedAt *metav1.Time `json:"reportedAt,omitempty"`
}

// BuildJobStatus is what the controller has observed of the job.
type BuildJobStatus struct {
	// Phase summarises where the job is.
	// +optional
	Phase BuildJobPhase `json:"phase,omitempty"`
	// ExitStatus is the job's exit status as reported to Buildkite; -1 when it never ran or was killed.
	// +optional
	ExitStatus *int32 `json:"exitStatus,omitempty"`
	// Signal that ended the job's command, such as SIGKILL.
	// +optional
	Signal string `json:"signal,omitempty"`
	// SignalReason as reported to Buildkite: cancel, stack_error, agent_stop, ...
	// +optional
	SignalReason string `json:"signalReason,omitempty"`
	// PodName is the job's pod.
	// +optional
	PodName string `json:"podName,omitempty"`
	// Times of each step of the job's life.
	// +optional
	Times BuildJobTimes `json:"times,omitempty"`
	// Log counts the output sent to Buildkite.
	// +optional
	Log LogProgress `json:"log,omitempty"`
	// Message says, for a person, what is happening or what went wrong.
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: PodCreated, Started, Finished, Reported.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BuildJob is one Buildkite job, run as a pod.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bj,categories=buildkite
// +kubebuilder:printcolumn:name="Pipeline",type=string,JSONPath=`.spec.pipelineSlug`
// +kubebuilder:printcolumn:name="Build",type=integer,JSONPath=`.spec.buildNumber`
// +kubebuilder:printcolumn:name="Step",type=string,JSONPath=`.spec.label`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Exit",type=integer,JSONPath=`.status.exitStatus`
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.status.podName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Environment",type=string,JSONPath=`.spec.buildEnvironment`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.signalReason`,priority=1
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.buildURL`,priority=1
type BuildJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BuildJobSpec   `json:"spec"`
	Status BuildJobStatus `json:"status,omitempty"`
}

// BuildJobList is a list of BuildJobs.
// +kubebuilder:object:root=true
type BuildJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BuildJob `json:"items"`
}

func init() {
	SchemeBuilder.Register(&BuildJob{}, &BuildJobList{})
}
