package podbuilder

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// WarmFits reports whether job, which runs in env, can run in the warm pod warm: whether
// the pod Build would make for it, less what its hand-off carries and its assignment
// patches (jobView), is the warm pod as BuildWarm made it, less its hand-off parts. It
// compares whole pod specs, not a list of fields, so that any difference a job makes sends
// it to a pod of its own. warm may be read back from the API server: its spec then has
// Kubernetes' defaults in it, so it is compared through the hash BuildWarm left in
// AnnotationWarmTemplate. When it does not fit, why says why, for a cluster operator.
//
// A job does not fit a warm pod of another environment or namespace, one being deleted,
// one made from an older generation of env or with other hand-off settings, or any warm
// pod of an environment whose spec.env the kubelet resolves per pod
// (validation.ColdEnv).
func WarmFits(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, warm *corev1.Pod) (ok bool, why string) {
	if job == nil || env == nil || warm == nil {
		return false, "checking a warm pod needs the BuildJob, its BuildEnvironment and the warm pod"
	}
	if why := warmPodOf(job, env, warm); why != "" {
		return false, why
	}
	if why := validation.ColdEnv(env); why != "" {
		return false, fmt.Sprintf("BuildEnvironment %s's jobs all start cold: %s", env.Name, why)
	}
	if why := handoffCurrent(warm, opts); why != "" {
		return false, why
	}
	cold, err := Build(job, env, opts)
	if err != nil {
		return false, fmt.Sprintf("the job's own pod cannot be built: %v", err)
	}
	want, err := templateHash(&cold.Spec)
	if err != nil {
		return false, err.Error()
	}
	if want == warm.Annotations[AnnotationWarmTemplate] {
		return true, ""
	}
	return false, templateDifference(cold, env, opts, warm)
}

// warmPodOf says why warm is not a usable warm pod of env in job's namespace, or "".
func warmPodOf(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, warm *corev1.Pod) string {
	owner := metav1.GetControllerOf(warm)
	switch {
	case warm.Labels[LabelWarmPool] == "" || warm.Annotations[AnnotationWarmTemplate] == "":
		return fmt.Sprintf("pod %s is not a warm pod: it lacks the %s label or the %s annotation", warm.Name, LabelWarmPool, AnnotationWarmTemplate)
	case warm.DeletionTimestamp != nil:
		return fmt.Sprintf("warm pod %s is being deleted", warm.Name)
	case warm.Namespace != job.Namespace:
		return fmt.Sprintf("warm pod %s is in namespace %s, the job in %s", warm.Name, warm.Namespace, job.Namespace)
	case job.Spec.BuildEnvironment != "" && job.Spec.BuildEnvironment != env.Name:
		return fmt.Sprintf("the job runs in BuildEnvironment %s, not %s", job.Spec.BuildEnvironment, env.Name)
	case owner == nil || owner.Kind != "BuildEnvironment" || owner.Name != env.Name ||
		env.UID != "" && owner.UID != env.UID || warm.Labels[LabelWarmPool] != validation.LabelValue(env.Name):
		return fmt.Sprintf("warm pod %s is in the pool of another BuildEnvironment (%s), not of %s, which the job runs in", warm.Name, warm.Labels[LabelWarmPool], env.Name)
	}
	if made, now := warm.Annotations[AnnotationEnvironmentGeneration], strconv.FormatInt(env.Generation, 10); made != now {
		return fmt.Sprintf("BuildEnvironment %s has changed since warm pod %s was made from it (generation %s then, %s now); the pool replaces it",
			env.Name, warm.Name, made, now)
	}
	return ""
}

// handoffCurrent says why warm's hand-off settings are not opts', or "": a pod with an
// old audience or endpoint would wait for a job it can never fetch. It reads the
// annotation BuildWarm left (AnnotationWarmHandoff), as the operator's cache keeps no
// pod's env or volumes.
func handoffCurrent(warm *corev1.Pod, opts Options) string {
	if warm.Annotations[AnnotationWarmHandoff] != handoffKey(opts) {
		return fmt.Sprintf("warm pod %s was made for another hand-off endpoint, audience or CA than the operator's now (%s, audience %q)", warm.Name, opts.HandoffURL, opts.HandoffAudience)
	}
	return ""
}

// templateDifference says where the job's pod cold differs from warm, whose template hash
// is not cold's: the first difference from the warm pod env and opts would make now, else
// (the warm pod was made with other settings of the operator) the first image that differs.
func templateDifference(cold *corev1.Pod, env *bkv1.BuildEnvironment, opts Options, warm *corev1.Pod) string {
	const prefix = "the job needs a pod of its own: "
	if now, err := BuildWarm(env, opts, warm.Name); err == nil {
		if d := specDifference(jobView(&cold.Spec), jobView(&now.Spec)); d != "" {
			return prefix + d
		}
	}
	if d := containersDifference(cold.Spec.InitContainers, warm.Spec.InitContainers, "init container", imageOnly); d != "" {
		return prefix + d + ", as the operator's settings have changed since the warm pod was made"
	}
	return prefix + "warm pod " + warm.Name + " was made by another version of the operator, or with other settings, whose pods differ from this job's"
}

// specDifference says, for a cluster operator, where the pod a job needs (job) first
// differs from a warm pod (warm), or "" when they are the same.
func specDifference(job, warm *corev1.PodSpec) string {
	if d := containersDifference(job.InitContainers, warm.InitContainers, "init container", containerDifference); d != "" {
		return d
	}
	if d := containersDifference(job.Containers, warm.Containers, "container", containerDifference); d != "" {
		return d
	}
	if f := differentField(reflect.ValueOf(job).Elem(), reflect.ValueOf(warm).Elem(), "InitContainers", "Containers"); f != "" {
		return fmt.Sprintf("its pod's spec.%s differs from the warm pod's", f)
	}
	return ""
}

// containersDifference compares two lists of containers by name, then each pair with differ.
func containersDifference(job, warm []corev1.Container, kind string, differ func(job, warm *corev1.Container, kind string) string) string {
	for i := range max(len(job), len(warm)) {
		switch {
		case i >= len(warm):
			return fmt.Sprintf("its pod has %s %s, which the warm pod lacks", kind, job[i].Name)
		case i >= len(job):
			return fmt.Sprintf("the warm pod has %s %s, which the job's pod lacks", kind, warm[i].Name)
		case job[i].Name != warm[i].Name:
			return fmt.Sprintf("its pod has %s %s where the warm pod has %s", kind, job[i].Name, warm[i].Name)
		}
		if d := differ(&job[i], &warm[i], kind); d != "" {
			return d
		}
	}
	return ""
}

func imageOnly(job, warm *corev1.Container, kind string) string {
	if job.Image != warm.Image {
		return fmt.Sprintf("its %s %s would run image %s, the warm pod's runs %s", kind, job.Name, job.Image, warm.Image)
	}
	return ""
}

func containerDifference(job, warm *corev1.Container, kind string) string {
	if job.Name == podcontract.JobContainer && !equality.Semantic.DeepEqual(job.Resources, warm.Resources) {
		return fmt.Sprintf("the job asks for its own resources (%s), the warm pod has its environment's (%s)",
			describeResources(job.Resources), describeResources(warm.Resources))
	}
	if d := imageOnly(job, warm, kind); d != "" {
		return d
	}
	if f := differentField(reflect.ValueOf(job).Elem(), reflect.ValueOf(warm).Elem()); f != "" {
		return fmt.Sprintf("its %s %s differs from the warm pod's in its %s", kind, job.Name, f)
	}
	return ""
}

// differentField is the JSON name of the first field of the structs a and b that differs,
// skipping the fields named skip, or "".
func differentField(a, b reflect.Value, skip ...string) string {
	for i := range a.NumField() {
		f := a.Type().Field(i)
		if slices.Contains(skip, f.Name) || equality.Semantic.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
			return name
		}
		return f.Name
	}
	return ""
}

// describeResources writes r as "requests cpu=2 memory=4Gi; limits memory=4Gi".
func describeResources(r corev1.ResourceRequirements) string {
	var parts []string
	for _, l := range []struct {
		name string
		list corev1.ResourceList
	}{{"requests", r.Requests}, {"limits", r.Limits}} {
		if len(l.list) == 0 {
			continue
		}
		var items []string
		for _, n := range slices.Sorted(maps.Keys(l.list)) {
			q := l.list[n]
			items = append(items, string(n)+"="+q.String())
		}
		parts = append(parts, l.name+" "+strings.Join(items, " "))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}
