package v1alpha1

import corev1 "k8s.io/api/core/v1"

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
