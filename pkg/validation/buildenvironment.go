package validation

import (
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// BuildEnvironment checks that env describes a pod that could run, that it uses no
// privilege it does not allow (Privileges), and that its pipeline patterns compile.
// Warnings name settings that are legal but risky.
func BuildEnvironment(env *bkv1.BuildEnvironment) (field.ErrorList, []string) {
	var errs field.ErrorList
	var warnings []string
	spec := field.NewPath("spec")
	s := &env.Spec

	errs = append(errs, environmentImageErrors(env)...)
	warnings = append(warnings, floatingTagWarnings(env)...)
	volumeErrs, volumes := checkVolumes(spec.Child("volumes"), s.Volumes)
	errs = append(errs, volumeErrs...)
	errs = append(errs, Privileges(env)...)
	errs = append(errs, checkCommandContainer(spec, s, volumes)...)
	errs = append(errs, checkExtraContainers(spec, s, volumes)...)
	errs = append(errs, checkAgent(spec, env, volumes)...)
	warnings = append(warnings, agentImageWarnings(env)...)
	errs = append(errs, checkGit(spec, env)...)
	warnings = append(warnings, gitWarnings(env)...)
	errs = append(errs, checkAllowedPipelines(spec.Child("allowedPipelines"), s.AllowedPipelines)...)
	warnings = append(warnings, riskWarnings(s)...)
	warmErrs, warmWarnings := checkWarmPool(spec, env)
	errs = append(errs, warmErrs...)
	warnings = append(warnings, warmWarnings...)
	return errs, warnings
}

// floatingTagWarnings names every image of env that a registry may move under it.
func floatingTagWarnings(env *bkv1.BuildEnvironment) []string {
	var warnings []string
	for _, img := range environmentImages(env) {
		if img.image != "" && floatingTag(img.image) {
			warnings = append(warnings, fmt.Sprintf(
				"%s: %q runs whatever the registry tags latest, so the same build may get a different image tomorrow; pin a version or a digest",
				img.path, img.image))
		}
	}
	return warnings
}

// checkVolumes checks the names of the environment's volumes (p is spec.volumes), and
// returns the names it declares, for the mounts to be checked against.
func checkVolumes(p *field.Path, vols []corev1.Volume) (field.ErrorList, map[string]bool) {
	var errs field.ErrorList
	volumes := map[string]bool{}
	firstVolume := map[string]*field.Path{}
	for i, v := range vols {
		vp := p.Index(i)
		switch prev, dup := firstVolume[v.Name]; {
		case v.Name == VolumeWorkspace:
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, fmt.Sprintf(
				"%q is reserved for the volume the operator mounts at %s in every container; choose another name (configure the workspace itself with spec.workspace)",
				VolumeWorkspace, WorkspacePath)))
		case slices.Contains(ReservedVolumeNames, v.Name):
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, fmt.Sprintf(
				"%q is reserved for a volume the operator adds to every job pod; choose another name", v.Name)))
		case dup:
			errs = append(errs, field.Invalid(vp.Child("name"), v.Name, fmt.Sprintf("already used by %s; every volume needs its own name", prev)))
		default:
			firstVolume[v.Name] = vp
		}
		volumes[v.Name] = true
	}
	return errs, volumes
}

// checkCommandContainer checks the command container: the operator names it, the
// environment configures it (its resources and mounts).
func checkCommandContainer(spec *field.Path, s *bkv1.BuildEnvironmentSpec, volumes map[string]bool) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, checkRequirements(spec.Child("resources"), s.Resources)...)
	errs = append(errs, checkResourceList(spec.Child("maxResources"), s.MaxResources)...)
	if len(s.MaxResources) > 0 {
		// A job that asks for nothing gets spec.resources; if that is already above the
		// cap, every such job would be refused.
		what, fix := "set by spec.maxResources", "lower it or raise spec.maxResources"
		errs = append(errs, checkMax(spec.Child("resources", "requests"), s.Resources.Requests, s.MaxResources, what, fix)...)
		errs = append(errs, checkMax(spec.Child("resources", "limits"), s.Resources.Limits, s.MaxResources, what, fix)...)
	}
	errs = append(errs, checkMounts(spec.Child("volumeMounts"), s.VolumeMounts, volumes)...)
	for i, m := range s.VolumeMounts {
		switch p := path.Clean(m.MountPath); {
		case p == AgentdBinPath || strings.HasPrefix(p, AgentdBinPath+"/"):
			errs = append(errs, field.Invalid(spec.Child("volumeMounts").Index(i).Child("mountPath"), m.MountPath, fmt.Sprintf(
				"%s is where the operator puts its supervisor and buildkite-agent in the job's container; mount this volume elsewhere", AgentdBinPath)))
		case p == HandoffPath:
			errs = append(errs, field.Invalid(spec.Child("volumeMounts").Index(i).Child("mountPath"), m.MountPath, fmt.Sprintf(
				"%s is where the operator mounts a warm pod's hand-off token in the job's container; mount this volume elsewhere", HandoffPath)))
		}
	}
	return errs
}

// checkExtraContainers checks the environment's init containers and sidecars: their names
// (unique across both), resources and mounts.
func checkExtraContainers(spec *field.Path, s *bkv1.BuildEnvironmentSpec, volumes map[string]bool) field.ErrorList {
	var errs field.ErrorList
	names := map[string]*field.Path{}
	for _, group := range []struct {
		field      string
		containers []corev1.Container
	}{{"initContainers", s.InitContainers}, {"sidecars", s.Sidecars}} {
		for i, c := range group.containers {
			p := spec.Child(group.field).Index(i)
			errs = append(errs, checkContainerName(p.Child("name"), c.Name, names)...)
			errs = append(errs, checkRequirements(p.Child("resources"), c.Resources)...)
			errs = append(errs, checkMounts(p.Child("volumeMounts"), c.VolumeMounts, volumes)...)
		}
	}
	return errs
}

// checkAllowedPipelines checks that every pattern of spec.allowedPipelines (p) compiles.
func checkAllowedPipelines(p *field.Path, patterns []string) field.ErrorList {
	var errs field.ErrorList
	for i, pattern := range patterns {
		if _, err := path.Match(pattern, ""); err != nil {
			errs = append(errs, field.Invalid(p.Index(i), pattern, fmt.Sprintf(
				"not a valid pattern (%v); use path.Match globs such as \"payments-*\", \"deploy-?\" or \"*\", and escape a literal [ ] * ? or \\ with \\", err)))
		}
	}
	return errs
}

// riskWarnings names the settings of s that are legal but let a job reach beyond itself.
func riskWarnings(s *bkv1.BuildEnvironmentSpec) []string {
	var warnings []string
	if len(s.Resources.Limits) == 0 {
		warnings = append(warnings,
			"spec.resources.limits: not set, so one job can use all the CPU and memory of its node; set limits to protect the other pods there")
	}
	if s.AutomountServiceAccountToken {
		sa := s.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		warnings = append(warnings, fmt.Sprintf(
			"spec.automountServiceAccountToken: every job gets a Kubernetes API token for service account %q; make sure its RBAC grants only what jobs need", sa))
	}
	if len(s.AllowedPipelines) == 0 {
		warnings = append(warnings,
			"spec.allowedPipelines: empty, so every pipeline of the organization may use this environment; list the pipelines that may, such as \"payments-*\"")
	}
	if s.Allow.Privileged || s.Allow.HostPath {
		warnings = append(warnings,
			"spec.allow: privileged containers and hostPath volumes let any job of this environment take over its node; allow them only for pipelines you trust with the node (spec.allowedPipelines)")
	}
	return warnings
}

type imageAt struct {
	path  *field.Path
	image string
}

func environmentImages(env *bkv1.BuildEnvironment) []imageAt {
	spec := field.NewPath("spec")
	out := []imageAt{{spec.Child("image"), env.Spec.Image}}
	for i, c := range env.Spec.InitContainers {
		out = append(out, imageAt{spec.Child("initContainers").Index(i).Child("image"), c.Image})
	}
	for i, c := range env.Spec.Sidecars {
		out = append(out, imageAt{spec.Child("sidecars").Index(i).Child("image"), c.Image})
	}
	return out
}

// environmentImageErrors reports every missing or malformed image of env.
func environmentImageErrors(env *bkv1.BuildEnvironment) field.ErrorList {
	var errs field.ErrorList
	for _, img := range environmentImages(env) {
		if e := checkImage(img.path, img.image); e != nil {
			errs = append(errs, e)
		}
	}
	return errs
}

func checkContainerName(p *field.Path, name string, seen map[string]*field.Path) field.ErrorList {
	switch {
	case name == "":
		return field.ErrorList{field.Required(p, "give the container a name, such as postgres")}
	case slices.Contains(ReservedContainerNames, name):
		return field.ErrorList{field.Invalid(p, name, fmt.Sprintf(
			"%q is reserved for a container the operator adds to every job pod; choose another name", name))}
	}
	if prev, dup := seen[name]; dup {
		return field.ErrorList{field.Invalid(p, name, fmt.Sprintf(
			"already used by %s; every container of the pod (init containers and sidecars) needs its own name", prev))}
	}
	seen[name] = p
	if msgs := k8svalidation.IsDNS1123Label(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, name, "must be lowercase letters, digits and '-', starting and ending with a letter or digit, such as postgres")}
	}
	return nil
}

func checkMounts(p *field.Path, mounts []corev1.VolumeMount, volumes map[string]bool) field.ErrorList {
	var errs field.ErrorList
	paths := map[string]*field.Path{}
	for i, m := range mounts {
		mp := p.Index(i)
		// The workspace volume is the operator's, but a container may mount it at a second
		// path of its choosing (a sidecar that expects its sources at /app, say).
		if m.Name != VolumeWorkspace && !volumes[m.Name] {
			errs = append(errs, field.Invalid(mp.Child("name"), m.Name, fmt.Sprintf(
				"no volume named %q in spec.volumes; add the volume there or remove the mount", m.Name)))
		}
		clean := path.Clean(m.MountPath)
		switch prev, dup := paths[clean]; {
		case clean == WorkspacePath:
			errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, fmt.Sprintf(
				"%s is where the operator mounts the job's workspace; mount this volume elsewhere, such as /cache", WorkspacePath)))
		case dup:
			errs = append(errs, field.Invalid(mp.Child("mountPath"), m.MountPath, fmt.Sprintf(
				"already used by %s; a container can mount only one volume at a path", prev)))
		default:
			paths[clean] = mp
		}
	}
	return errs
}
