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

// PluginPolicy says what the jobs of an environment do with a step's plugins.
// +kubebuilder:validation:Enum=Enabled;Validated;Disabled
type PluginPolicy string

const (
	// PluginsEnabled runs a step's plugins, as an agent does by default.
	PluginsEnabled PluginPolicy = "Enabled"
	// PluginsValidated checks each plugin's configuration against its plugin.yml before it
	// runs (the agent's --plugin-validation).
	PluginsValidated PluginPolicy = "Validated"
	// PluginsDisabled refuses steps that use plugins (the agent's --no-plugins), other
	// than the operator's own plugin, which only passes options to the operator.
	PluginsDisabled PluginPolicy = "Disabled"
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
}

// EffectiveRunner is the runner of the environment's jobs: spec.runner, or DefaultRunner for
// an environment that the API server has not defaulted (one made in Go).
func (s *BuildEnvironmentSpec) EffectiveRunner() RunnerMode {
	if s.Runner == "" {
		return DefaultRunner
	}
	return s.Runner
}

// AgentSettings are the settings of `buildkite-agent start` that an environment's jobs see.
// Anything else an agent's configuration can say is a BUILDKITE_* variable in spec.env
// (BUILDKITE_GIT_CHECKOUT_FLAGS, BUILDKITE_GIT_MIRRORS_LOCK_TIMEOUT, ...), which wins over
// the step's own env as agent settings do.
type AgentSettings struct {
	// HooksConfigMap names a ConfigMap in the environment's namespace whose keys are agent
	// hooks (environment, pre-command, post-checkout, ...), each an executable script. It
	// is mounted at /buildkite/hooks, the jobs' BUILDKITE_HOOKS_PATH. Needs the Bootstrap
	// runner.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	HooksConfigMap string `json:"hooksConfigMap,omitempty"`
	// Plugins: Enabled (the default) runs a step's plugins; Validated checks their
	// configuration against each plugin's plugin.yml first; Disabled refuses steps that
	// use plugins.
	// +optional
	Plugins PluginPolicy `json:"plugins,omitempty"`
	// GitCloneFlags are the flags of the checkout's `git clone` (BUILDKITE_GIT_CLONE_FLAGS);
	// the agent's "-v" when empty.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	GitCloneFlags string `json:"gitCloneFlags,omitempty"`
	// GitFetchFlags are the flags of the checkout's `git fetch` (BUILDKITE_GIT_FETCH_FLAGS);
	// the agent's "-v --prune" when empty.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	GitFetchFlags string `json:"gitFetchFlags,omitempty"`
	// GitMirrorsVolume names a volume of spec.volumes (a PersistentVolumeClaim, usually
	// ReadWriteMany) that keeps a bare mirror of each repository, shared by jobs: it is
	// mounted at /buildkite/git-mirrors (BUILDKITE_GIT_MIRRORS_PATH), and checkouts clone
	// with --reference to it, fetching only what is new. Needs the Bootstrap runner.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	GitMirrorsVolume string `json:"gitMirrorsVolume,omitempty"`
	// RedactedVars are patterns of variable names (such as *_CREDENTIALS or DEPLOY_KEY)
	// whose values are redacted from the job's log, in addition to the agent's defaults
	// (*_PASSWORD, *_SECRET, *_TOKEN, *_PRIVATE_KEY, *_SSH_KEY, *_ACCESS_KEY, *_SECRET_KEY,
	// *_CONNECTION_STRING, *_API_KEY).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	RedactedVars []string `json:"redactedVars,omitempty"`
	// CancelGracePeriodSeconds is how long a canceled job's command has between SIGTERM
	// and SIGKILL (the agent's --cancel-grace-period). Default: terminationGracePeriodSeconds
	// less a few seconds. It must be shorter than terminationGracePeriodSeconds when both
	// are set.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	CancelGracePeriodSeconds *int32 `json:"cancelGracePeriodSeconds,omitempty"`
	// Image is the image jobs get buildkite-agent from, instead of the operator's
	// (--agent-image, Buildkite's buildkite/agent at the release the operator was made
	// for): an init container of the job's pod runs it to copy its
	// /usr/local/bin/buildkite-agent into the pod, so the image needs that file, a shell
	// and cp, as buildkite/agent and images built from it have.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.contains(' ')",message="agent.image must not contain spaces; give a reference such as buildkite/agent:3.138.1 or registry.example.com/ci/agent@sha256:..."
	// +optional
	Image string `json:"image,omitempty"`
	// ImagePullPolicy of the agent's image; the operator's (--agent-image-pull-policy)
	// when empty.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
}

// Keys a git Secret is read from when the environment names none: those of the Secret
// types Kubernetes defines for them (kubernetes.io/ssh-auth and kubernetes.io/basic-auth),
// and the file git's credential store keeps.
const (
	DefaultGitSSHKeyKey      = corev1.SSHAuthPrivateKey
	DefaultGitCredentialsKey = ".git-credentials"
	DefaultGitUsernameKey    = corev1.BasicAuthUsernameKey
	DefaultGitPasswordKey    = corev1.BasicAuthPasswordKey
)

// GitSettings are the credentials the checkout's git (and the git of plugin checkouts) uses
// for private repositories. Each Secret is mounted read-only into the job's container only,
// and, being a Secret the jobs can read, must be listed in spec.allow.secrets (which needs
// the verb grant and get on the Secret, as every Secret an environment gives its jobs).
type GitSettings struct {
	// SSHSecret names a Secret with an SSH private key for repositories reached over SSH
	// (git@github.com:acme/app.git, ssh://git@git.example.com/app.git), and optionally the
	// known_hosts lines of their servers.
	// +optional
	SSHSecret *GitSSHSecret `json:"sshSecret,omitempty"`
	// CredentialsSecret names a Secret with credentials for repositories reached over https.
	// +optional
	CredentialsSecret *GitCredentialsSecret `json:"credentialsSecret,omitempty"`
}

// GitSSHSecret is a Secret holding an SSH private key, such as one made with
// `kubectl create secret generic deploy-key --type=kubernetes.io/ssh-auth
// --from-file=ssh-privatekey=id_ed25519 --from-file=known_hosts=known_hosts`.
type GitSSHSecret struct {
	// Name of the Secret, in the environment's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// KeyKey is the key of the private key (OpenSSH or PEM, without a passphrase);
	// "ssh-privatekey", the key of a kubernetes.io/ssh-auth Secret, when empty.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	KeyKey string `json:"keyKey,omitempty"`
	// KnownHostsKey is the key of the servers' known_hosts lines (what `ssh-keyscan
	// github.com` prints, checked against what the host publishes). With it, ssh connects
	// only to a server whose host key is listed (StrictHostKeyChecking=yes); without it, a
	// server's key is taken unverified, as the agent's ssh-keyscan does on a new agent.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	KnownHostsKey string `json:"knownHostsKey,omitempty"`
}

// PrivateKeyKey is the key of the private key: KeyKey, or DefaultGitSSHKeyKey.
func (s *GitSSHSecret) PrivateKeyKey() string {
	if s.KeyKey == "" {
		return DefaultGitSSHKeyKey
	}
	return s.KeyKey
}

// GitCredentialsSecret is a Secret holding credentials for git over https: either a
// git-credentials file (key), or, with url, a username and a password (or token) for that
// server alone, as a kubernetes.io/basic-auth Secret holds them.
// +kubebuilder:validation:XValidation:rule="!(has(self.key) && has(self.url))",message="credentialsSecret takes key (a git-credentials file) or url (with a username and a password), not both"
// +kubebuilder:validation:XValidation:rule="has(self.url) || !(has(self.usernameKey) || has(self.passwordKey))",message="credentialsSecret.usernameKey and passwordKey need url: the https server the username and password are for"
type GitCredentialsSecret struct {
	// Name of the Secret, in the environment's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Key is the key of a git-credentials file: one https://<user>:<password or
	// token>@<host> line per server, as `git credential-store` writes it (characters such
	// as @ and : in a password percent-encoded). ".git-credentials" when empty, unless url
	// is set.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
	// URL is the https server (https://host or https://host:port, no path) that the
	// Secret's username and password are for: with it, git gives them to that server only.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	URL string `json:"url,omitempty"`
	// UsernameKey is the key of the username, with url; "username" when empty.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	UsernameKey string `json:"usernameKey,omitempty"`
	// PasswordKey is the key of the password or token, with url; "password" when empty.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	PasswordKey string `json:"passwordKey,omitempty"`
}

// FileKey is the key of the git-credentials file: Key, or DefaultGitCredentialsKey; ""
// when the Secret holds a username and a password (URL is set).
func (s *GitCredentialsSecret) FileKey() string {
	switch {
	case s.URL != "":
		return ""
	case s.Key == "":
		return DefaultGitCredentialsKey
	}
	return s.Key
}

// UsernameAndPasswordKeys are the keys of the username and the password, with their
// defaults; both "" when the Secret holds a git-credentials file (URL is not set).
func (s *GitCredentialsSecret) UsernameAndPasswordKeys() (username, password string) {
	if s.URL == "" {
		return "", ""
	}
	username, password = s.UsernameKey, s.PasswordKey
	if username == "" {
		username = DefaultGitUsernameKey
	}
	if password == "" {
		password = DefaultGitPasswordKey
	}
	return username, password
}

// Allow lists the privileges the pods of an environment may use. A setting that needs one
// of them is refused unless it is allowed here: by the webhook when the environment is
// written, in the environment's Ready condition, and when a job's pod is built, so that an
// environment admitted while the webhook was off still cannot use it. hostNetwork, hostPID
// and hostIPC cannot be set in a BuildEnvironment at all. A privilege follows the person who
// grants it: writing an environment that allows anything needs the verb grant on
// buildenvironments, as well as get on each Secret listed and create on the token of its
// service account (the webhook asks the API server).
type Allow struct {
	// Privileged lets containers run privileged, with every device and capability of the
	// node, with an unmasked /proc (procMount: Unmasked), or with SELinux options beyond a
	// confined container type (an SELinux user or role, or a type such as spc_t).
	// +optional
	Privileged bool `json:"privileged,omitempty"`
	// PrivilegeEscalation lets containers set allowPrivilegeEscalation: true.
	// +optional
	PrivilegeEscalation bool `json:"privilegeEscalation,omitempty"`
	// RunAsRoot lets the pod or its containers set runAsUser: 0.
	// +optional
	RunAsRoot bool `json:"runAsRoot,omitempty"`
	// HostPath lets the pod mount hostPath volumes: the node's files.
	// +optional
	HostPath bool `json:"hostPath,omitempty"`
	// HostPorts lets containers bind ports on the node's network (ports[].hostPort).
	// +optional
	HostPorts bool `json:"hostPorts,omitempty"`
	// Unconfined lets the pod or its containers run with a seccomp or AppArmor profile
	// other than RuntimeDefault or Localhost, such as Unconfined.
	// +optional
	Unconfined bool `json:"unconfined,omitempty"`
	// Capabilities containers may add beyond the runtime's default set (AUDIT_WRITE,
	// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID,
	// SETPCAP, SETUID, SYS_CHROOT, which need no entry), such as SYS_PTRACE or NET_ADMIN.
	// ALL allows any.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Capabilities []corev1.Capability `json:"capabilities,omitempty"`
	// Secrets are the names of the Secrets, in the environment's namespace, that its
	// containers' env and envFrom and its volumes (secret, projected, and the secretRef of
	// csi, azureFile, cephfs, cinder, flexVolume, iscsi, rbd, scaleIO and storageos) may
	// refer to. Jobs can read every Secret listed.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Secrets []string `json:"secrets,omitempty"`
	// Sysctls the pod may set (spec.podSecurityContext.sysctls) beyond those Kubernetes
	// counts safe for any pod (kernel.shm_rmid_forced, net.ipv4.ip_local_port_range,
	// net.ipv4.ip_local_reserved_ports, net.ipv4.ip_unprivileged_port_start,
	// net.ipv4.ping_group_range, net.ipv4.tcp_syncookies, net.ipv4.tcp_keepalive_time,
	// net.ipv4.tcp_keepalive_intvl, net.ipv4.tcp_keepalive_probes, net.ipv4.tcp_fin_timeout,
	// net.ipv4.tcp_rmem and net.ipv4.tcp_wmem, which need no entry). The kubelet must allow
	// them too (--allowed-unsafe-sysctls).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Sysctls []string `json:"sysctls,omitempty"`
	// ServiceAccount lets the pod run as spec.serviceAccountName and give its containers
	// a Kubernetes API token (spec.automountServiceAccountToken, or a projected
	// serviceAccountToken volume). Without it job pods get no Kubernetes API access.
	// +optional
	ServiceAccount bool `json:"serviceAccount,omitempty"`
	// PersistentVolumeClaims are the names of the PersistentVolumeClaims, in the
	// environment's namespace, that its volumes may mount (persistentVolumeClaim.claimName):
	// a claim holds whatever the workloads that share it wrote there, and jobs can read and
	// change all of it. Ephemeral volumes and a workspace volumeClaimTemplate need no entry:
	// each makes a claim of the pod's own.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	PersistentVolumeClaims []string `json:"persistentVolumeClaims,omitempty"`
	// PriorityClasses are the PriorityClasses the pod may name in spec.priorityClassName:
	// a priority above other pods' lets jobs preempt them, evicting them from their nodes.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	PriorityClasses []string `json:"priorityClasses,omitempty"`
	// Tolerations are the keys of the node taints the pod may tolerate (spec.tolerations);
	// "*" lets it tolerate every taint (a toleration with an empty key and operator
	// Exists), and so run on any node, the control plane's included. Keys, not whole
	// tolerations: a taint's key is what keeps a set of nodes (a node pool, the control
	// plane, GPUs) for some pods, and a toleration of the key, whatever its value and
	// effect, is what lets a pod onto them. The node.kubernetes.io/not-ready and
	// node.kubernetes.io/unreachable taints, which Kubernetes has every pod tolerate for a
	// while, need no entry.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	// +listType=set
	// +optional
	Tolerations []string `json:"tolerations,omitempty"`
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
