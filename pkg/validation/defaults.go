package validation

import (
	"strconv"
	"strings"

	k8svalidation "k8s.io/apimachinery/pkg/util/validation"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// EnvironmentName is the BuildEnvironment job runs in: its own choice, else the
// operator's default.
func EnvironmentName(job *bkv1.BuildJob, defaultEnvironment string) string {
	if job.Spec.BuildEnvironment != "" {
		return job.Spec.BuildEnvironment
	}
	return defaultEnvironment
}

// ApplyDefaults fills in what a BuildJob may leave out: the operator's default
// environment, the labels that let kubectl select jobs by pipeline, build, step, job and
// environment, and the timeout (the step's BUILDKITE_TIMEOUT, else the environment's
// default). env is the environment EnvironmentName(job, defaultEnvironment) names, or nil
// when it does not exist. The mutating webhook and the spawner both call it.
func ApplyDefaults(job *bkv1.BuildJob, defaultEnvironment string, env *bkv1.BuildEnvironment) {
	job.Spec.BuildEnvironment = EnvironmentName(job, defaultEnvironment)

	if job.Labels == nil {
		job.Labels = map[string]string{}
	}
	// The labels are derived from the spec, so they are always overwritten: a label that
	// disagreed with the spec would make `kubectl get bj -l ...` lie.
	set := func(key, value string) {
		if v := LabelValue(value); v != "" {
			job.Labels[key] = v
		} else {
			delete(job.Labels, key)
		}
	}
	set(bkv1.LabelPipeline, job.Spec.PipelineSlug)
	set(bkv1.LabelBuild, strconv.FormatInt(job.Spec.BuildNumber, 10))
	set(bkv1.LabelStep, job.Spec.StepKey)
	set(bkv1.LabelJob, job.Spec.JobID)
	set(bkv1.LabelEnvironment, job.Spec.BuildEnvironment)

	if job.Spec.TimeoutMinutes == nil {
		minutes, ok, err := StepTimeout(job.Spec.Env)
		switch {
		case err != nil:
			// Left unset: validation reports the malformed BUILDKITE_TIMEOUT, and a default
			// here would hide it.
		case ok:
			job.Spec.TimeoutMinutes = &minutes
		case env != nil && env.Spec.Timeouts.DefaultMinutes != nil:
			d := *env.Spec.Timeouts.DefaultMinutes
			job.Spec.TimeoutMinutes = &d
		}
	}
}

// LabelValue makes s a valid label value: characters other than letters, digits, '-',
// '_' and '.' become '-', it is cut to 63 characters and trimmed to start and end with a
// letter or digit. Step keys in particular may hold any character.
func LabelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	out := string(b)
	if len(out) > k8svalidation.LabelValueMaxLength {
		out = out[:k8svalidation.LabelValueMaxLength]
	}
	return strings.Trim(out, "-_.")
}
