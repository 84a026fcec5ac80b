// Package podcontract names what the controller's pod builder and the in-pod supervisor
// agree on: container and volume names, paths, and the environment variables through which
// the controller configures the supervisor. Both sides import it so neither can drift.
package podcontract

const (
	// JobContainer runs the supervisor, which runs the job's command.
	JobContainer = "job"
	// InstallContainer is the init container that runs the operator's image to copy
	// agentd-supervise into BinVolume. buildkite-agent is not in the operator's image: the
	// pod's other init container, AgentInstallContainer, copies it from the agent's image.
	InstallContainer = "agentd-install"

	// BinVolume is the emptyDir holding agentd-supervise (from the operator's image) and
	// buildkite-agent (from the agent's image) for the job container.
	BinVolume = "agentd-bin"
	// BinDir is where BinVolume is mounted in the install and job containers. The job sees
	// it as BUILDKITE_BIN_PATH, as an agent's jobs see the folder of the agent's binary.
	BinDir = "/buildkite-operator"
	// SupervisorPath is the supervisor binary inside the job container: agentd-supervise,
	// the supervisor without the rest of agentd (cmd/agentd-supervise), which the install
	// container copies from ImageSupervisorPath.
	SupervisorPath = BinDir + "/agentd-supervise"
	// ImageSupervisorPath is where the operator's image keeps agentd-supervise.
	ImageSupervisorPath = "/usr/local/bin/agentd-supervise"
	// FinishFlushedFlag is the flag of the supervisor that has it finish the job on
	// Buildkite itself once the command has ended and its output is all sent.
	FinishFlushedFlag = "finish-flushed"
	// AgentPath is the job's buildkite-agent inside the job container, which
	// AgentInstallContainer copies there from the agent's image (Buildkite's buildkite/agent,
	// the operator's --agent-image, or the BuildEnvironment's spec.agent.image): the
	// supervisor runs `buildkite-agent bootstrap` from here, whatever the job's image holds.
	AgentPath = BinDir + "/buildkite-agent"
	// ImageAgentPath is where the operator's image kept buildkite-agent before job pods got
	// it from the agent's image; nothing uses it now (the agent's image keeps it at
	// AgentImageBinaryPath, the same path).
	ImageAgentPath = "/usr/local/bin/buildkite-agent"

	// HooksDir is the agent hooks folder of every job (BUILDKITE_HOOKS_PATH), where the
	// agent's own container image keeps it. The ConfigMap of BuildEnvironment
	// spec.agent.hooksConfigMap is mounted there, as HooksVolume; without one, an image may
	// bring its own hooks there.
	HooksDir = "/buildkite/hooks"
	// HooksVolume is the volume of the hooks ConfigMap.
	HooksVolume = "buildkite-hooks"
	// GitMirrorsDir is where the volume of BuildEnvironment spec.agent.gitMirrorsVolume is
	// mounted in the job container (BUILDKITE_GIT_MIRRORS_PATH).
	GitMirrorsDir = "/buildkite/git-mirrors"

	// WorkspaceVolume is mounted at WorkspaceDir in every container of the pod.
	WorkspaceVolume = "workspace"
	// WorkspaceDir is the job's working directory and checkout.
	WorkspaceDir = "/workspace"
)

// Environment variables the controller sets on the job container, besides the job's own env.
const (
	// EnvPodMarker holds the BuildJob's namespace/name in every job pod: the plugin's hooks
	// use it to tell that the step runs under the operator and not on an ordinary agent
	// (plugin.OperatorJobEnv is this constant). PodMarker gives its value.
	EnvPodMarker = "BUILDKITE_OPERATOR_JOB"
	// EnvRunner is Command or Bootstrap (BuildEnvironment.spec.runner): RunnerCommand or
	// RunnerBootstrap.
	EnvRunner = "BK_OPERATOR_RUNNER"
	// EnvLogPaths lists files to stream into the log, separated by ';'.
	EnvLogPaths = "BK_OPERATOR_LOG_PATHS"
	// EnvChunkMaxBytes is the largest log chunk Buildkite accepts (Job.chunks_max_size_bytes).
	EnvChunkMaxBytes = "BK_OPERATOR_CHUNK_MAX_BYTES"
	// EnvChunkInterval is how often output is sent, in seconds (Job.chunks_interval_seconds).
	EnvChunkInterval = "BK_OPERATOR_CHUNK_INTERVAL_SECONDS"
	// EnvJobStatusInterval is how often the supervisor polls the job's state, in seconds.
	EnvJobStatusInterval = "BK_OPERATOR_JOB_STATUS_INTERVAL_SECONDS"
	// EnvSignalGrace is how long, in seconds, a canceled command has between SIGTERM and SIGKILL.
	EnvSignalGrace = "BK_OPERATOR_SIGNAL_GRACE_SECONDS"
	// EnvLogMaxBytes is the most log Buildkite keeps for the job (Job.log_max_size_bytes,
	// BuildJob spec.logLimits.logMaxSizeBytes). As the agent, the supervisor sends what
	// comes after it all the same and warns once in its own log.
	EnvLogMaxBytes = "BK_OPERATOR_LOG_MAX_BYTES"
	// EnvTimeoutSeconds is how long the job may run, in seconds from its start on
	// Buildkite: BuildJob spec.timeoutMinutes (the plugin's timeout_in_minutes), else the
	// BuildEnvironment's spec.timeouts.defaultMinutes. Past it the supervisor stops the
	// command as on a cancel and finishes the job with exit status -1. Unset: no timeout.
	EnvTimeoutSeconds = "BK_OPERATOR_TIMEOUT_SECONDS"
	// EnvTimeoutSource says where EnvTimeoutSeconds comes from, for the log line that tells
	// the pipeline author which timeout fired: TimeoutSourceStep or TimeoutSourceEnvironment.
	EnvTimeoutSource = "BK_OPERATOR_TIMEOUT_SOURCE"
	// EnvProgressPath overrides where the supervisor keeps its progress (the termination message file).
	EnvProgressPath = "BK_OPERATOR_PROGRESS_PATH"
	// EnvJobEnvNames lists, separated by ',', the variables of the job's env as Buildkite
	// gave it: the supervisor writes them to BUILDKITE_ENV_FILE, as an agent does.
	EnvJobEnvNames = "BK_OPERATOR_JOB_ENV_NAMES"
	// EnvReplacedPrefix, before the name of a variable of the job's env that the agent's
	// settings replace (BUILDKITE_GIT_CLONE_FLAGS set by a step, say), carries the job's own
	// value: the job sees the agent's, and the supervisor writes the job's to
	// BUILDKITE_ENV_FILE, as an agent does.
	EnvReplacedPrefix = "BK_OPERATOR_REPLACED_"

	// EnvLocal is "true" in the pod of a BuildJob made by hand (v1alpha1.MadeByHand),
	// which has no job token and no agent endpoint: the supervisor runs the command without
	// Buildkite (nothing started, streamed or finished there) and writes its output to its
	// own stdout, for kubectl logs. Unset, or "false", in every other pod.
	EnvLocal = "BK_OPERATOR_LOCAL"

	// EnvIntakeLog carries, in the job's env (the BuildJob's Secret), what the agent that
	// accepts a job prints in its log before bootstrap runs and the spawner had no log
	// stream to write to: that the job's signature was verified, or a warning that it was
	// not (--verification-failure-behavior warn). The supervisor writes it first into the
	// log and takes it out of the job's env. The spawner sets it, replacing any value a
	// step's env gives it, so that a job cannot forge those lines.
	EnvIntakeLog = "BK_OPERATOR_INTAKE_LOG"

	// EnvHandoffURL, set only in a warm pod's job container (BuildEnvironment
	// spec.warmPool), is the https URL of agentd's hand-off endpoint (pkg/handoff): the
	// supervisor waits there for the job the pod is given, then runs it with the job's env
	// over its own. It is set in no job pod: a job pod's env already holds its job. The
	// supervisor gives none of the three hand-off variables to the job.
	EnvHandoffURL = "BK_OPERATOR_HANDOFF_URL"
	// EnvHandoffTokenPath is the file of the warm pod's projected ServiceAccount token, with
	// the hand-off endpoint's audience: it proves to the endpoint which pod asks. The
	// supervisor reads it at every attempt, as the kubelet rotates it.
	EnvHandoffTokenPath = "BK_OPERATOR_HANDOFF_TOKEN_PATH"
	// EnvHandoffCAPath is the file of the PEM CA bundle that signs the hand-off endpoint's
	// serving certificate; unset, the system's roots.
	EnvHandoffCAPath = "BK_OPERATOR_HANDOFF_CA_PATH"

	// EnvAccessToken carries the job token (from the BuildJob's Secret), as on any agent.
	EnvAccessToken = "BUILDKITE_AGENT_ACCESS_TOKEN"
	// EnvEndpoint is the agent API the job reports to.
	EnvEndpoint = "BUILDKITE_AGENT_ENDPOINT"
	// EnvJobID is the Buildkite job UUID.
	EnvJobID = "BUILDKITE_JOB_ID"
	// EnvCommand is the step's command.
	EnvCommand = "BUILDKITE_COMMAND"
)

// HandoffFailedPrefix begins the error in the progress record (jobprogress.Progress.Error,
// the termination message) of a warm pod whose supervisor could not get its job: the
// endpoint refused it (the job handed off already, an unknown pod, a token not accepted)
// or the pod's hand-off settings are wrong. Nothing of any job ran or reached Buildkite, so
// the controller can tell it from a job that the supervisor could not run.
const HandoffFailedPrefix = "the warm pod could not get its job: "

// PodMarker is the value of EnvPodMarker in the pod of the BuildJob namespace/name.
func PodMarker(namespace, name string) string { return namespace + "/" + name }

// The agent's folders under a job's workspace (the agent's --build-path, --plugins-path and
// --sockets-path): the pod builder sets them for the pod's /workspace, the supervisor for
// whatever workspace it is given when the pod did not.
const (
	// BuildSubdir holds the checkouts (BUILDKITE_BUILD_PATH); bootstrap checks out into
	// <build path>/<agent name>/<organization>/<pipeline>.
	BuildSubdir = "build"
	// PluginsSubdir holds the plugins bootstrap checks out (BUILDKITE_PLUGINS_PATH).
	PluginsSubdir = ".buildkite-agent/plugins"
	// SocketsSubdir holds the agent's sockets (BUILDKITE_SOCKETS_PATH).
	SocketsSubdir = ".buildkite-agent/sockets"
)

// The runners, as EnvRunner carries them. They are BuildEnvironment spec.runner's values
// (v1alpha1.RunnerMode's constants are defined from these), kept here so that the supervisor
// reads them without importing the API types and the Kubernetes packages beneath them,
// which would double its memory in every job pod (docs/performance.md).
const (
	RunnerCommand   = "Command"
	RunnerBootstrap = "Bootstrap"
	// DefaultRunner is the runner when none is named.
	DefaultRunner = RunnerBootstrap
)

// The values of EnvTimeoutSource.
const (
	// TimeoutSourceStep: the step chose its timeout (the buildkite-operator plugin's
	// timeout_in_minutes, or BK_OPERATOR_TIMEOUT_IN_MINUTES in its env).
	TimeoutSourceStep = "step"
	// TimeoutSourceEnvironment: the BuildEnvironment's spec.timeouts.defaultMinutes.
	TimeoutSourceEnvironment = "environment"
)
