package podbuilder

import (
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
)

// The agent's defaults for the settings a BuildEnvironment may leave out: those of
// `buildkite-agent start` v3.138.1 (clicommand/agent_start.go and the flags it shares in
// clicommand/global.go).
const (
	agentGitCloneFlags         = "-v"
	agentGitFetchFlags         = "-v --prune"
	agentGitCheckoutFlags      = "-f"
	agentGitCleanFlags         = "-ffxdq"
	agentGitCloneMirrorFlags   = "-v"
	agentGitMirrorsLockTime    = "300"
	agentGitMirrorCheckoutMode = "reference"
	agentGitSparseCheckoutMode = "cone"
	agentCheckoutAttempts      = "6"
	// The checkout-override mode: the agent's default, "from-job", lets a step's env choose
	// neither git's flags nor commit verification, but lets it choose a sparse checkout.
	agentCheckoutOverrideMode = "from-job"
	agentTraceContextEncoding = "gob"
)

// protectedEnv are the variables that `buildkite-agent start` sets over the job's env
// whatever the job says, in the order it sets them (JobRunner.createEnvironment in
// v3.138.1, with the agent's defaults): a step's env that sets one is ignored, and named in
// BUILDKITE_IGNORED_ENV in this order, for bootstrap to warn about. Those the pod builder
// cannot know (the env files, the pid, the shell, the cancel timing) the supervisor sets.
// Left out, as the agent with its defaults leaves them to the job: the sparse checkout
// (sparseCheckout), BUILDKITE_GIT_REMOTE_MIRROR_URL, and git's submodules, skip-checkout,
// skip-fetch and checkout-timeout toggles, which the agent only sets when its configuration
// turns them away from their defaults. BUILDKITE_PLUGIN_VALIDATION depends on the job's
// value: the supervisor decides (see pkg/supervisor agentValues).
var protectedEnv = []string{
	"BUILDKITE_ENV_FILE",
	"BUILDKITE_ENV_JSON_FILE",
	"BUILDKITE_AGENT_JOB_TIMEOUT_FILE",
	"BUILDKITE_AGENT_ENDPOINT",
	"BUILDKITE_AGENT_ACCESS_TOKEN",
	"BUILDKITE_NO_HTTP2",
	"BUILDKITE_AGENT_DEBUG",
	"BUILDKITE_AGENT_DEBUG_HTTP",
	"BUILDKITE_AGENT_PID",
	"BUILDKITE_BIN_PATH",
	"BUILDKITE_CONFIG_PATH",
	"BUILDKITE_BUILD_PATH",
	"BUILDKITE_SOCKETS_PATH",
	"BUILDKITE_GIT_MIRRORS_PATH",
	"BUILDKITE_GIT_MIRRORS_SKIP_UPDATE",
	"BUILDKITE_HOOKS_PATH",
	"BUILDKITE_ADDITIONAL_HOOKS_PATHS",
	"BUILDKITE_PLUGINS_PATH",
	"BUILDKITE_SSH_KEYSCAN",
	"BUILDKITE_CHECKOUT_OVERRIDE_MODE",
	"BUILDKITE_CHECKOUT_ATTEMPTS",
	"BUILDKITE_COMMAND_EVAL",
	"BUILDKITE_PLUGINS_ENABLED",
	"BUILDKITE_LOCAL_HOOKS_ENABLED",
	"BUILDKITE_GIT_CHECKOUT_FLAGS",
	"BUILDKITE_GIT_CLONE_FLAGS",
	"BUILDKITE_GIT_FETCH_FLAGS",
	"BUILDKITE_GIT_CLONE_MIRROR_FLAGS",
	"BUILDKITE_GIT_MIRROR_CHECKOUT_MODE",
	"BUILDKITE_GIT_CLEAN_FLAGS",
	"BUILDKITE_GIT_MIRRORS_LOCK_TIMEOUT",
	"BUILDKITE_GIT_SUBMODULE_CLONE_CONFIG",
	"BUILDKITE_GIT_COMMIT_VERIFICATION",
	"BUILDKITE_SHELL",
	"BUILDKITE_HOOKS_SHELL",
	"BUILDKITE_AGENT_EXPERIMENT",
	"BUILDKITE_REDACTED_VARS",
	"BUILDKITE_STRICT_SINGLE_HOOKS",
	"BUILDKITE_CANCEL_GRACE_PERIOD",
	"BUILDKITE_SIGNAL_GRACE_PERIOD_SECONDS",
	"BUILDKITE_TRACE_CONTEXT_ENCODING",
	"BUILDKITE_JOB_LOGS_OTLP",
	"BUILDKITE_AGENT_DISABLE_WARNINGS_FOR",
}

// sparseCheckout are the agent's checkout settings that a step's env may set under the
// default checkout-override mode: the agent's value only when the job has none.
var sparseCheckout = map[string]string{
	"BUILDKITE_GIT_SPARSE_CHECKOUT_PATHS": "",
	"BUILDKITE_GIT_SPARSE_CHECKOUT_MODE":  agentGitSparseCheckoutMode,
}

// envRemoteMirrorURL is Buildkite's remote git mirror for the job. The agent always sets
// it, empty when the job has none, so that bootstrap never takes one from its own
// environment; it is written to the env files too (see pkg/supervisor writeEnvFiles).
const envRemoteMirrorURL = "BUILDKITE_GIT_REMOTE_MIRROR_URL"

// envPluginValidation is the one agent setting a step may turn on from its env.
const envPluginValidation = "BUILDKITE_PLUGIN_VALIDATION"

// agentEnv is what `buildkite-agent start` adds to a job's env before bootstrap runs
// (JobRunner.createEnvironment in v3.138.1), with the pod's paths and the environment's
// spec.agent. jobNames are the names of the job's own env. What only the running
// supervisor knows (BUILDKITE_AGENT_PID, the env files, the job timeout marker, the cancel
// timing, and BUILDKITE_SHELL, which depends on the image having bash) it sets itself.
func agentEnv(env *bkv1.BuildEnvironment, binPath string, jobNames []string) []corev1.EnvVar {
	a := &env.Spec.Agent
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	mirrors := ""
	if a.GitMirrorsVolume != "" {
		mirrors = podcontract.GitMirrorsDir
	}
	ws := podcontract.WorkspaceDir
	settings := map[string]string{
		"BUILDKITE_ADDITIONAL_HOOKS_PATHS":     "",
		"BUILDKITE_AGENT_DEBUG":                "false",
		"BUILDKITE_AGENT_DEBUG_HTTP":           "false",
		"BUILDKITE_AGENT_DISABLE_WARNINGS_FOR": "",
		"BUILDKITE_AGENT_EXPERIMENT":           "",
		"BUILDKITE_BIN_PATH":                   binPath,
		"BUILDKITE_BUILD_PATH":                 path.Join(ws, podcontract.BuildSubdir),
		"BUILDKITE_CHECKOUT_ATTEMPTS":          agentCheckoutAttempts,
		"BUILDKITE_CHECKOUT_OVERRIDE_MODE":     agentCheckoutOverrideMode,
		"BUILDKITE_COMMAND_EVAL":               "true",
		"BUILDKITE_CONFIG_PATH":                "",
		"BUILDKITE_GIT_CHECKOUT_FLAGS":         agentGitCheckoutFlags,
		"BUILDKITE_GIT_CLEAN_FLAGS":            agentGitCleanFlags,
		"BUILDKITE_GIT_CLONE_FLAGS":            or(a.GitCloneFlags, agentGitCloneFlags),
		"BUILDKITE_GIT_CLONE_MIRROR_FLAGS":     agentGitCloneMirrorFlags,
		"BUILDKITE_GIT_COMMIT_VERIFICATION":    "",
		"BUILDKITE_GIT_FETCH_FLAGS":            or(a.GitFetchFlags, agentGitFetchFlags),
		"BUILDKITE_GIT_MIRROR_CHECKOUT_MODE":   agentGitMirrorCheckoutMode,
		"BUILDKITE_GIT_MIRRORS_LOCK_TIMEOUT":   agentGitMirrorsLockTime,
		"BUILDKITE_GIT_MIRRORS_PATH":           mirrors,
		"BUILDKITE_GIT_MIRRORS_SKIP_UPDATE":    "false",
		"BUILDKITE_GIT_SUBMODULE_CLONE_CONFIG": "",
		"BUILDKITE_HOOKS_PATH":                 podcontract.HooksDir,
		"BUILDKITE_HOOKS_SHELL":                "",
		"BUILDKITE_JOB_LOGS_OTLP":              "false",
		"BUILDKITE_LOCAL_HOOKS_ENABLED":        "true",
		"BUILDKITE_NO_HTTP2":                   "false",
		"BUILDKITE_PLUGINS_ENABLED":            strconv.FormatBool(a.Plugins != bkv1.PluginsDisabled),
		"BUILDKITE_PLUGINS_PATH":               path.Join(ws, podcontract.PluginsSubdir),
		redact.EnvRedactedVars:                 strings.Join(redactedVars(a.RedactedVars), ","),
		"BUILDKITE_SOCKETS_PATH":               path.Join(ws, podcontract.SocketsSubdir),
		"BUILDKITE_SSH_KEYSCAN":                "true",
		"BUILDKITE_STRICT_SINGLE_HOOKS":        "false",
		"BUILDKITE_TRACE_CONTEXT_ENCODING":     agentTraceContextEncoding,
	}
	// What the job may set itself keeps the job's value, which is in the pod already.
	for k, v := range sparseCheckout {
		if !slices.Contains(jobNames, k) {
			settings[k] = v
		}
	}
	if !slices.Contains(jobNames, envRemoteMirrorURL) {
		settings[envRemoteMirrorURL] = ""
	}
	// The agent turns validation on when its configuration or the step's env asks for it.
	// The step's value is in the token Secret, out of reach here: a step that sets it keeps
	// its own unless the environment asks for validation, and the supervisor makes of it
	// what the agent does.
	if a.Plugins == bkv1.PluginsValidated || !slices.Contains(jobNames, envPluginValidation) {
		settings[envPluginValidation] = strconv.FormatBool(a.Plugins == bkv1.PluginsValidated)
	}
	var ignored []string
	for _, n := range protectedEnv {
		if slices.Contains(jobNames, n) {
			ignored = append(ignored, n)
		}
	}
	if len(ignored) > 0 {
		settings["BUILDKITE_IGNORED_ENV"] = strings.Join(ignored, ",")
	}
	vars := make([]corev1.EnvVar, 0, len(settings))
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		vars = append(vars, literalEnv(k, settings[k]))
	}
	return vars
}

// replacedJobValues are the job's own values of the variables whose value the job does not
// see, as on an agent: those only the agent's configuration sets (left out of the pod's env)
// and those agentEnv sets. Each goes under podcontract.EnvReplacedPrefix, for the supervisor
// to write to BUILDKITE_ENV_FILE, which on an agent holds the job's env as Buildkite sent
// it. A value from the token Secret stays there.
func replacedJobValues(job *bkv1.BuildJob, agent []corev1.EnvVar) []corev1.EnvVar {
	replaced := func(name string) bool {
		// Buildkite never sends the token in the env; should a job have it, it stays out.
		return name != podcontract.EnvAccessToken && (slices.Contains(protectedEnv, name) ||
			slices.ContainsFunc(agent, func(e corev1.EnvVar) bool { return e.Name == name }))
	}
	var vars []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(job.Spec.Env)) {
		if replaced(k) {
			vars = append(vars, literalEnv(podcontract.EnvReplacedPrefix+k, job.Spec.Env[k]))
		}
	}
	for _, k := range secretEnvNames(job) {
		if replaced(k) {
			vars = append(vars, corev1.EnvVar{Name: podcontract.EnvReplacedPrefix + k, ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: job.Spec.TokenSecretRef.Name},
					Key:                  bkv1.EnvSecretKey(k),
				},
			}})
		}
	}
	return vars
}

// redactedVars are the agent's default patterns, then the environment's own.
func redactedVars(extra []string) []string {
	out := slices.Clone(redact.DefaultPatterns)
	for _, p := range extra {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// agentMounts are the job container's mounts of spec.agent's volumes.
func agentMounts(env *bkv1.BuildEnvironment) []corev1.VolumeMount {
	var mounts []corev1.VolumeMount
	if env.Spec.Agent.HooksConfigMap != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: podcontract.HooksVolume, MountPath: podcontract.HooksDir, ReadOnly: true})
	}
	if v := env.Spec.Agent.GitMirrorsVolume; v != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: v, MountPath: podcontract.GitMirrorsDir})
	}
	return mounts
}

// agentVolumes are the pod's volumes for spec.agent: the hooks ConfigMap, its scripts
// executable. The git mirrors volume is one of spec.volumes already.
func agentVolumes(env *bkv1.BuildEnvironment) []corev1.Volume {
	name := env.Spec.Agent.HooksConfigMap
	if name == "" {
		return nil
	}
	return []corev1.Volume{{Name: podcontract.HooksVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: name},
		DefaultMode:          ptr(int32(0o755)),
	}}}}
}

// secretEnvNames are the names of the job's env whose values the pod takes from the token
// Secret (spec.envNames): none for a BuildJob made by hand, which gives its env in clear
// in spec.env, since the operator reads no Secret its maker named (see jobEnv).
func secretEnvNames(job *bkv1.BuildJob) []string {
	if bkv1.MadeByHand(job) {
		return nil
	}
	return job.Spec.EnvNames
}

// jobEnvNames are the names of the job's env as Buildkite gave it, sorted.
func jobEnvNames(job *bkv1.BuildJob) []string {
	names := slices.Collect(maps.Keys(job.Spec.Env))
	for _, n := range secretEnvNames(job) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}
