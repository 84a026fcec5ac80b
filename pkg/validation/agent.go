package validation

import (
	"fmt"
	"path"
	"strings"

	"github.com/distribution/reference"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Where the operator mounts the volumes of spec.agent in the job's container.
const (
	// HooksPath is where spec.agent.hooksConfigMap is mounted (BUILDKITE_HOOKS_PATH).
	HooksPath = podcontract.HooksDir
	// GitMirrorsPath is where spec.agent.gitMirrorsVolume is mounted (BUILDKITE_GIT_MIRRORS_PATH).
	GitMirrorsPath = podcontract.GitMirrorsDir
)

// checkAgent checks the environment's agent settings (spec.agent): what they name exists,
// what they mount does not collide with the environment's own mounts, and they can work
// with its runner.
func checkAgent(spec *field.Path, env *bkv1.BuildEnvironment, volumes map[string]bool) field.ErrorList {
	var errs field.ErrorList
	s := &env.Spec
	a := &s.Agent
	p := spec.Child("agent")
	bootstrap := s.EffectiveRunner() == bkv1.RunnerBootstrap

	// mountTaken reports the environment's own mounts of the job container at at.
	mountTaken := func(at, what string) {
		for i, m := range s.VolumeMounts {
			if path.Clean(m.MountPath) == at {
				errs = append(errs, field.Invalid(spec.Child("volumeMounts").Index(i).Child("mountPath"), m.MountPath, fmt.Sprintf(
					"%s is where the operator mounts %s in the job's container; mount this volume elsewhere", at, what)))
			}
		}
	}
	if name := a.HooksConfigMap; name != "" {
		switch {
		case len(k8svalidation.IsDNS1123Subdomain(name)) > 0:
			errs = append(errs, field.Invalid(p.Child("hooksConfigMap"), name, "not a ConfigMap name: lowercase letters, digits, '-' and '.', such as ci-hooks"))
		case !bootstrap:
			errs = append(errs, field.Invalid(p.Child("hooksConfigMap"), name, fmt.Sprintf(
				"only the %s runner runs agent hooks; set spec.runner to %s or remove the hooks", bkv1.RunnerBootstrap, bkv1.RunnerBootstrap)))
		}
		mountTaken(HooksPath, "spec.agent.hooksConfigMap")
	}
	if name := a.GitMirrorsVolume; name != "" {
		switch {
		case !volumes[name]:
			errs = append(errs, field.Invalid(p.Child("gitMirrorsVolume"), name, fmt.Sprintf(
				"no volume named %q in spec.volumes; add the volume (a PersistentVolumeClaim, usually ReadWriteMany) there", name)))
		case !bootstrap:
			errs = append(errs, field.Invalid(p.Child("gitMirrorsVolume"), name, fmt.Sprintf(
				"only the %s runner checks out from git mirrors; set spec.runner to %s or remove the mirrors", bkv1.RunnerBootstrap, bkv1.RunnerBootstrap)))
		}
		mountTaken(GitMirrorsPath, "spec.agent.gitMirrorsVolume")
	}
	for _, f := range []struct{ name, value string }{{"gitCloneFlags", a.GitCloneFlags}, {"gitFetchFlags", a.GitFetchFlags}} {
		// The agent splits them into words; a line break or NUL would end up in git's
		// arguments or cut the variable short.
		if strings.ContainsAny(f.value, "\n\r\x00") {
			errs = append(errs, field.Invalid(p.Child(f.name), f.value, "must be one line of flags, such as -v --depth=1"))
		}
	}
	for i, pattern := range a.RedactedVars {
		switch _, err := path.Match(pattern, ""); {
		case strings.TrimSpace(pattern) == "":
			errs = append(errs, field.Required(p.Child("redactedVars").Index(i), "give a pattern of variable names, such as *_CREDENTIALS"))
		case err != nil || strings.Contains(pattern, ","):
			if err == nil {
				err = fmt.Errorf("a comma separates patterns")
			}
			errs = append(errs, field.Invalid(p.Child("redactedVars").Index(i), pattern, fmt.Sprintf(
				"not a valid pattern (%v); use path.Match globs such as *_CREDENTIALS", err)))
		}
	}
	if c, t := a.CancelGracePeriodSeconds, s.TerminationGracePeriodSeconds; c != nil && t != nil && int64(*c) >= *t {
		errs = append(errs, field.Invalid(p.Child("cancelGracePeriodSeconds"), *c, fmt.Sprintf(
			"must be less than spec.terminationGracePeriodSeconds (%d), or the kubelet kills the job before its cancel grace period ends; lower it or raise spec.terminationGracePeriodSeconds", *t)))
	}
	if img := a.Image; img != "" {
		// ParseNormalizedNamed is what the kubelet and the runtimes parse a reference with.
		if _, err := reference.ParseNormalizedNamed(img); err != nil {
			errs = append(errs, field.Invalid(p.Child("image"), img, fmt.Sprintf(
				"not a valid image reference (%v); give an image with buildkite-agent at %s, such as buildkite/agent:3.138.1 or registry.example.com/ci/agent@sha256:..., or leave it out for the operator's",
				err, podcontract.AgentImageBinaryPath)))
		}
	}
	return errs
}

// agentImageWarnings warns of an agent image (spec.agent.image) that floats: jobs would
// get whatever buildkite-agent the registry has today.
func agentImageWarnings(env *bkv1.BuildEnvironment) []string {
	img := env.Spec.Agent.Image
	if img == "" || !floatingTag(img) {
		return nil
	}
	return []string{fmt.Sprintf(
		"spec.agent.image: %q runs whatever buildkite-agent the registry tags latest, so the same build may get another agent tomorrow; pin a release (buildkite/agent:3.138.1) or a digest", img)}
}
