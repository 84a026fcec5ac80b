package podbuilder

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// jobEnv is the job container's environment, later entries winning: the job's env (given
// in clear, then taken from the token Secret), the agent's settings (agentEnv), git's
// settings for spec.git (gitEnv), the environment's env (which, being the agent's
// configuration, may change them), then what
// the operator itself sets, which nothing may override (a job must not point its token at
// another endpoint). As on an agent, the job's own values of the agent's protected
// settings are left out (and named in BUILDKITE_IGNORED_ENV).
//
// A BuildJob made by hand (bkv1.MadeByHand) gets nothing from its token Secret, neither
// the job token nor env values, and no agent endpoint: whoever made it may name any
// Secret there, and the operator must not read one for them. Its pod has
// podcontract.EnvLocal instead, and its supervisor runs the command without Buildkite.
//
// A nil job is a warm pod's (see build): only what comes from the environment and the
// operator's options, as a job's pod has it; the hand-off brings the job's whole list.
func jobEnv(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, binPath string, signalGrace time.Duration) []corev1.EnvVar {
	var vars []corev1.EnvVar
	var names []string
	if job != nil {
		vars = jobOwnEnv(job)
		names = jobEnvNames(job)
	}
	agent := agentEnv(env, binPath, names)
	vars = append(vars, agent...)
	if job != nil {
		vars = append(vars, replacedJobValues(job, agent)...)
	}
	// What spec.git tells git, before the environment's env: an environment that sets
	// GIT_SSH_COMMAND itself has its own way.
	vars = append(vars, gitEnv(env)...)
	// As given, not through literalEnv: these are Kubernetes EnvVars, where $(NAME) is
	// Kubernetes' reference (see literalEnv).
	for _, e := range env.Spec.Env {
		vars = append(vars, *e.DeepCopy())
	}
	vars = append(vars, operatorEnv(job, env, opts)...)
	vars = append(vars, supervisorEnv(job, env, opts, signalGrace, names)...)
	return dedupe(vars)
}

// jobOwnEnv is the job's env: the values given in clear in its spec, in name order, then
// those read from its token Secret, less the agent's protected settings and EnvLocal.
func jobOwnEnv(job *bkv1.BuildJob) []corev1.EnvVar {
	// Only the operator says whether a job runs without Buildkite: a step's env that sets
	// EnvLocal would have its job's command run with nothing reaching Buildkite.
	ignored := func(k string) bool { return slices.Contains(protectedEnv, k) || k == podcontract.EnvLocal }
	var vars []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(job.Spec.Env)) {
		if ignored(k) {
			continue
		}
		vars = append(vars, literalEnv(k, job.Spec.Env[k]))
	}
	// The values the spawner keeps out of the spec (a pipeline's env holds secrets) stay
	// out of the pod spec too: the kubelet reads each from the Secret.
	for _, k := range secretEnvNames(job) {
		if ignored(k) {
			continue
		}
		vars = append(vars, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: job.Spec.TokenSecretRef.Name},
				Key:                  bkv1.EnvSecretKey(k),
			},
		}})
	}
	return vars
}

// operatorEnv is what the operator tells the supervisor about the job, which nothing may
// override: its ID and command, how it reaches Buildkite (the job token from its Secret and
// the agent endpoint) or that it runs without Buildkite, the pod's marker and the runner.
// A warm pod (nil job) has the runner only.
func operatorEnv(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options) []corev1.EnvVar {
	runner := literalEnv(podcontract.EnvRunner, string(env.Spec.EffectiveRunner()))
	if job == nil {
		return []corev1.EnvVar{runner}
	}
	vars := []corev1.EnvVar{
		literalEnv(podcontract.EnvJobID, job.Spec.JobID),
		literalEnv(podcontract.EnvCommand, job.Spec.Command),
	}
	if bkv1.MadeByHand(job) {
		vars = append(vars, literalEnv(podcontract.EnvLocal, "true"))
	} else {
		vars = append(vars, corev1.EnvVar{Name: podcontract.EnvAccessToken, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: job.Spec.TokenSecretRef.Name},
				Key:                  job.Spec.TokenSecretRef.KeyOrDefault(),
			},
		}})
		endpoint := job.Spec.AgentEndpoint
		if endpoint == "" {
			endpoint = opts.AgentEndpoint
		}
		if endpoint != "" {
			vars = append(vars, literalEnv(podcontract.EnvEndpoint, endpoint))
		}
	}
	return append(vars, literalEnv(podcontract.EnvPodMarker, podcontract.PodMarker(job.Namespace, job.Name)), runner)
}

// supervisorEnv are the supervisor's settings for this job: the names of the job's own
// variables, its log paths and limits, its timeout, how often to poll the job's state and
// how long to wait between SIGTERM and SIGKILL. A warm pod (nil job) has the last two.
func supervisorEnv(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, signalGrace time.Duration, names []string) []corev1.EnvVar {
	var vars []corev1.EnvVar
	if job != nil {
		vars = jobSupervisorEnv(job, env, names)
	}
	return append(vars,
		literalEnv(podcontract.EnvJobStatusInterval, seconds(opts.JobStatusInterval)),
		literalEnv(podcontract.EnvSignalGrace, seconds(signalGrace)),
	)
}

// jobSupervisorEnv are the supervisor's settings that come from the job: the names of its
// own variables, its log paths and limits, and its timeout.
func jobSupervisorEnv(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, names []string) []corev1.EnvVar {
	var vars []corev1.EnvVar
	if len(names) > 0 {
		vars = append(vars, literalEnv(podcontract.EnvJobEnvNames, strings.Join(names, ",")))
	}
	if len(job.Spec.LogPaths) > 0 {
		vars = append(vars, literalEnv(podcontract.EnvLogPaths, strings.Join(job.Spec.LogPaths, ";")))
	}
	if n := job.Spec.LogLimits.ChunksMaxSizeBytes; n > 0 {
		vars = append(vars, literalEnv(podcontract.EnvChunkMaxBytes, strconv.FormatInt(n, 10)))
	}
	if n := job.Spec.LogLimits.ChunksIntervalSeconds; n > 0 {
		vars = append(vars, literalEnv(podcontract.EnvChunkInterval, strconv.Itoa(int(n))))
	}
	if n := job.Spec.LogLimits.LogMaxSizeBytes; n > 0 {
		vars = append(vars, literalEnv(podcontract.EnvLogMaxBytes, strconv.FormatInt(n, 10)))
	}
	// The supervisor ends the command at the job's own timeout and tells Buildkite then;
	// the pod's activeDeadlineSeconds (Build) is only the backstop past it.
	if minutes := timeoutMinutes(job, env); minutes > 0 {
		source := podcontract.TimeoutSourceEnvironment
		if job.Spec.TimeoutMinutes != nil {
			source = podcontract.TimeoutSourceStep
		}
		vars = append(vars,
			literalEnv(podcontract.EnvTimeoutSeconds, strconv.Itoa(int(minutes)*60)),
			literalEnv(podcontract.EnvTimeoutSource, source))
	}
	return vars
}

// dedupe keeps the last definition of each variable, in the position of the first, so
// the pod spec holds each name once (the API server warns about duplicates).
func dedupe(vars []corev1.EnvVar) []corev1.EnvVar {
	last := map[string]int{}
	for i, v := range vars {
		last[v.Name] = i
	}
	out := make([]corev1.EnvVar, 0, len(last))
	seen := map[string]bool{}
	for _, v := range vars {
		if seen[v.Name] {
			continue
		}
		seen[v.Name] = true
		out = append(out, vars[last[v.Name]])
	}
	return out
}
