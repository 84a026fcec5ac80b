package validation

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
)

// EnvTimeout is the job env variable in which Buildkite passes the step's
// timeout_in_minutes ("false" when the step sets none).
const EnvTimeout = "BUILDKITE_TIMEOUT"

// envPlugins is the job env variable holding the step's plugins as JSON.
const envPlugins = "BUILDKITE_PLUGINS"

// BuildJob checks a BuildJob against its BuildEnvironment (nil when it does not exist)
// and the LimitRanges of the job's namespace. available are the BuildEnvironments of the
// namespace: a job whose environment is missing or forbidden is told which ones its
// pipeline may use (EnvironmentProblem). It returns every problem, each saying what to
// fix, and warnings for what is legal but likely a mistake.
func BuildJob(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, limits []corev1.LimitRange, available []bkv1.BuildEnvironment) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	spec := field.NewPath("spec")

	if problem := EnvironmentProblem(job.Spec.PipelineSlug, job.Spec.BuildEnvironment, env, available); problem != "" {
		switch {
		case job.Spec.BuildEnvironment == "":
			errs = append(errs, field.Required(spec.Child("buildEnvironment"), problem))
		case env == nil:
			errs = append(errs, field.Invalid(spec.Child("buildEnvironment"), job.Spec.BuildEnvironment, problem))
		default:
			errs = append(errs, field.Forbidden(spec.Child("pipelineSlug"), problem))
		}
	} else if envErrs, _ := BuildEnvironment(env); len(envErrs) > 0 {
		// A BuildJob names no pod settings of its own: it runs the environment's. An
		// environment admitted before the webhook existed (or while it was off) may break
		// the rules; its job is refused now rather than run, or fail later at the pod. The
		// details are the cluster operator's, in the environment's Ready condition.
		problems := "1 problem"
		if len(envErrs) > 1 {
			problems = fmt.Sprintf("%d problems", len(envErrs))
		}
		errs = append(errs, field.Invalid(spec.Child("buildEnvironment"), env.Name, fmt.Sprintf(
			"BuildEnvironment %q cannot run jobs until a cluster operator fixes it (%s, listed in its Ready condition).", env.Name, problems)))
	}

	errs = append(errs, checkLogPaths(spec.Child("logPaths"), job.Spec.LogPaths)...)
	errs = append(errs, checkCommand(spec.Child("command"), job, env)...)
	errs = append(errs, checkRunnerCanRun(spec.Child("env"), job, env)...)
	e, w := checkTimeout(spec, job, env)
	errs, warnings = append(errs, e...), append(warnings, w...)
	errs = append(errs, checkJobResources(spec.Child("resources"), job, env, limits)...)
	return errs, warnings
}

// PipelineAllowed reports whether pipelineSlug matches one of env.Spec.AllowedPipelines
// (path.Match globs); an empty list allows every pipeline. A pattern that does not compile
// matches nothing: the BuildEnvironment webhook refuses such patterns, and failing closed
// keeps a typo from opening an environment to everyone.
func PipelineAllowed(env *bkv1.BuildEnvironment, pipelineSlug string) bool {
	if len(env.Spec.AllowedPipelines) == 0 {
		return true
	}
	for _, p := range env.Spec.AllowedPipelines {
		if ok, err := path.Match(p, pipelineSlug); err == nil && ok {
			return true
		}
	}
	return false
}

// StepTimeout parses the job env's BUILDKITE_TIMEOUT: ok is false when the step sets no
// timeout (absent, empty or "false").
func StepTimeout(env map[string]string) (minutes int32, ok bool, err error) {
	v, present := env[EnvTimeout]
	if !present || v == "" || v == "false" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 {
		return 0, false, fmt.Errorf("must be a whole number of minutes greater than 0, or \"false\" for no timeout")
	}
	return int32(n), true, nil
}

func checkLogPaths(p *field.Path, paths []string) field.ErrorList {
	var errs field.ErrorList
	for i, lp := range paths {
		switch {
		case !strings.HasPrefix(lp, "/"):
			// Same words as the CRD's rule, so that kubectl and the Buildkite log agree.
			errs = append(errs, field.Invalid(p.Index(i), lp, "logPaths must be absolute paths, such as /workspace/service.log"))
		case slices.Contains(strings.Split(lp, "/"), ".."):
			errs = append(errs, field.Invalid(p.Index(i), lp, "logPaths must not contain '..': name the file by its absolute path"))
		}
	}
	return errs
}

// checkCommand refuses a job with nothing to run. A Buildkite command step may leave out
// its command only when a plugin supplies one through a command hook, and only the
// Bootstrap runner runs plugin hooks; the Command runner would start a shell with an
// empty script and report a pass for a step that did nothing.
func checkCommand(p *field.Path, job *bkv1.BuildJob, env *bkv1.BuildEnvironment) field.ErrorList {
	if strings.TrimSpace(job.Spec.Command) != "" {
		return nil
	}
	// The spawner keeps the env's values in the token Secret (spec.envNames); the webhook
	// cannot read them, so a listed BUILDKITE_PLUGINS counts as plugins given.
	hasPlugins := hasPlugins(job.Spec.Env) || slices.Contains(job.Spec.EnvNames, envPlugins)
	if env == nil {
		if hasPlugins {
			return nil // the missing environment is reported already; it may be a Bootstrap one
		}
		return field.ErrorList{field.Required(p, "the step has no command and no plugin that could provide one; give the step a command")}
	}
	if env.Spec.EffectiveRunner() == bkv1.RunnerBootstrap {
		if hasPlugins {
			return nil
		}
		return field.ErrorList{field.Required(p, "the step has no command and no plugin that could provide one; give the step a command")}
	}
	return field.ErrorList{field.Required(p, fmt.Sprintf(
		"BuildEnvironment %q runs the step's command itself (runner Command), so the step needs a command; give the step a command, or use an environment with runner Bootstrap if a plugin provides it",
		env.Name))}
}

// hasPlugins reports whether env's BUILDKITE_PLUGINS names a plugin other than the
// operator's own (which the spawner strips, and which only passes options to the operator).
// Malformed plugins JSON counts as none: the spawner reports it.
func hasPlugins(env map[string]string) bool {
	v := strings.TrimSpace(env[envPlugins])
	if v == "" || v == "[]" || v == "null" {
		return false
	}
	others, err := plugin.StripOperatorPlugin(v)
	return err == nil && others != ""
}

// envArtifactPaths is the job env variable holding the step's artifact_paths (Buildkite
// sends it for every step, empty when there are none).
const envArtifactPaths = "BUILDKITE_ARTIFACT_PATHS"

// checkRunnerCanRun refuses a step that asks for what its environment will not do: plugins
// or artifact_paths under the Command runner, which runs the command alone, or plugins
// where the environment disables them. Refused when the job is accepted, the step fails at
// once with the reason in its log, rather than running without them and passing. The
// webhook sees the env's names only (the values are in the token Secret): a listed
// BUILDKITE_PLUGINS holds other plugins (the spawner drops it otherwise), and the
// spawner's own check, with the values, is the one that finds artifact_paths.
func checkRunnerCanRun(p *field.Path, job *bkv1.BuildJob, env *bkv1.BuildEnvironment) field.ErrorList {
	if env == nil {
		return nil
	}
	plugins := hasPlugins(job.Spec.Env) || (job.Spec.Env[envPlugins] == "" && slices.Contains(job.Spec.EnvNames, envPlugins))
	artifacts := strings.TrimSpace(job.Spec.Env[envArtifactPaths]) != ""
	const choose = "the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env)"
	var errs field.ErrorList
	if env.Spec.EffectiveRunner() == bkv1.RunnerCommand {
		without := func(what string) string {
			return fmt.Sprintf("BuildEnvironment %q runs only the step's command (runner %s), without %s; choose an environment whose runner is %s (the default) with %s, or ask a cluster operator for one",
				env.Name, bkv1.RunnerCommand, what, bkv1.RunnerBootstrap, choose)
		}
		if plugins {
			errs = append(errs, field.Forbidden(p.Key(envPlugins), without("the step's plugins")))
		}
		if artifacts {
			errs = append(errs, field.Forbidden(p.Key(envArtifactPaths), without("uploading the step's artifact_paths")))
		}
		return errs
	}
	if plugins && env.Spec.Agent.Plugins == bkv1.PluginsDisabled {
		errs = append(errs, field.Forbidden(p.Key(envPlugins), fmt.Sprintf(
			"BuildEnvironment %q runs no plugins (its agent settings disable them); remove the step's plugins, or choose another environment with %s",
			env.Name, choose)))
	}
	return errs
}

func checkTimeout(spec *field.Path, job *bkv1.BuildJob, env *bkv1.BuildEnvironment) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	envPath := spec.Child("env").Key(EnvTimeout)
	stepMinutes, stepOK, err := StepTimeout(job.Spec.Env)
	if err != nil {
		errs = append(errs, field.Invalid(envPath, job.Spec.Env[EnvTimeout], err.Error()))
	}
	var max *int32
	if env != nil {
		max = env.Spec.Timeouts.MaxMinutes
	}
	tooLong := func(p *field.Path, minutes int32) *field.Error {
		return field.Invalid(p, minutes, fmt.Sprintf(
			"exceeds the maximum of %d minutes that BuildEnvironment %q allows (spec.timeouts.maxMinutes); set the step's timeout_in_minutes to at most %d",
			*max, env.Name, *max))
	}
	switch {
	case job.Spec.TimeoutMinutes != nil:
		if max != nil && *job.Spec.TimeoutMinutes > *max {
			errs = append(errs, tooLong(spec.Child("timeoutMinutes"), *job.Spec.TimeoutMinutes))
		}
	case stepOK:
		// Not defaulted yet (the spawner validates before the mutating webhook runs).
		if max != nil && stepMinutes > *max {
			errs = append(errs, tooLong(envPath, stepMinutes))
		}
	case env != nil && env.Spec.Timeouts.DefaultMinutes == nil && err == nil:
		warnings = append(warnings, fmt.Sprintf(
			"spec.timeoutMinutes: not set, and BuildEnvironment %q has no spec.timeouts.defaultMinutes, so the job runs until it ends or is canceled in Buildkite; give the step a timeout_in_minutes",
			env.Name))
	}
	return errs, warnings
}

func checkJobResources(p *field.Path, job *bkv1.BuildJob, env *bkv1.BuildEnvironment, limits []corev1.LimitRange) field.ErrorList {
	var errs field.ErrorList
	var envRes *corev1.ResourceRequirements
	if env != nil {
		envRes = &env.Spec.Resources
	}
	if r := job.Spec.Resources; r != nil {
		errs = append(errs, checkResourceList(p.Child("requests"), r.Requests)...)
		errs = append(errs, checkResourceList(p.Child("limits"), r.Limits)...)
		if env != nil && len(env.Spec.MaxResources) > 0 {
			what := fmt.Sprintf("that BuildEnvironment %q allows (spec.maxResources)", env.Name)
			errs = append(errs, checkMax(p.Child("requests"), r.Requests, env.Spec.MaxResources, what, "ask for less")...)
			errs = append(errs, checkMax(p.Child("limits"), r.Limits, env.Spec.MaxResources, what, "ask for less")...)
		}
	}

	eff := EffectiveResources(job.Spec.Resources, envRes)
	fromEnv := func(kind string, name corev1.ResourceName) string {
		if env == nil {
			return ""
		}
		if job.Spec.Resources != nil {
			l := job.Spec.Resources.Requests
			if kind == "limits" {
				l = job.Spec.Resources.Limits
			}
			if _, ok := l[name]; ok {
				return ""
			}
		}
		return fmt.Sprintf(" (this value comes from BuildEnvironment %q spec.resources.%s)", env.Name, kind)
	}
	for _, name := range sortedNames(eff.Requests) {
		req := eff.Requests[name]
		lim, ok := eff.Limits[name]
		if !ok || req.Cmp(lim) <= 0 {
			continue
		}
		note := fromEnv("requests", name) + fromEnv("limits", name)
		errs = append(errs, field.Invalid(p.Child("requests").Key(string(name)), req.String(),
			fmt.Sprintf("must be less than or equal to the %s limit of %s%s; lower the request or raise the limit", name, lim.String(), note)))
	}

	max, from := limitRangeMax(limits)
	for _, kind := range []string{"requests", "limits"} {
		l := eff.Requests
		if kind == "limits" {
			l = eff.Limits
		}
		for _, name := range sortedNames(l) {
			q := l[name]
			m, ok := max[name]
			if !ok || q.Cmp(m) <= 0 {
				continue
			}
			errs = append(errs, field.Invalid(p.Child(kind).Key(string(name)), q.String(),
				fmt.Sprintf("exceeds the maximum of %s per container set by LimitRange %q in namespace %q%s; ask for at most %s",
					m.String(), from[name], job.Namespace, fromEnv(kind, name), m.String())))
		}
	}
	return errs
}

func quoteList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}
