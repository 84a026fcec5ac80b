package podbuilder

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// AnnotationWarmHandoff, on a warm pod, is a hash of the hand-off settings it was built
// with (endpoint, audience, CA ConfigMap). The operator's cache keeps no pod's env or
// volumes, where those settings are, so the annotation is what says whether a warm pod can
// still reach the endpoint the operator serves now.
const AnnotationWarmHandoff = "buildkite-operator.dev/warm-handoff"

// handoffKey is AnnotationWarmHandoff's value for opts.
func handoffKey(opts Options) string {
	sum := sha256.Sum256([]byte(strings.Join([]string{literalEnv("", opts.HandoffURL).Value, opts.HandoffAudience, opts.HandoffCAConfigMap}, "\x00")))
	return hex.EncodeToString(sum[:16])
}

// WarmStale says why pod, an unassigned warm pod of env, no longer serves as one, or "":
// env has changed since it was made, or the operator's settings (images, the hand-off
// endpoint), or env's jobs all start cold now. It reads the pod's labels and annotations
// only, which the operator's cache keeps.
func WarmStale(env *bkv1.BuildEnvironment, opts Options, pod *corev1.Pod) string {
	if made, now := pod.Annotations[AnnotationEnvironmentGeneration], strconv.FormatInt(env.Generation, 10); made != now {
		return fmt.Sprintf("BuildEnvironment %s has changed since the pod was made (generation %s then, %s now)", env.Name, made, now)
	}
	if pod.Annotations[AnnotationWarmHandoff] != handoffKey(opts) {
		return "the operator's hand-off endpoint has changed since the pod was made"
	}
	if why := validation.ColdEnv(env); why != "" {
		return fmt.Sprintf("BuildEnvironment %s's jobs all start cold: %s", env.Name, why)
	}
	now, err := BuildWarm(env, opts, pod.Name)
	if err != nil {
		return "a warm pod of the environment cannot be built any more: " + err.Error()
	}
	if now.Annotations[AnnotationWarmTemplate] != pod.Annotations[AnnotationWarmTemplate] {
		return "the operator's settings (its images, say) have changed since the pod was made"
	}
	return ""
}

// AssignWarm makes the warm pod pod job's own, as Build would have made it: the job's
// labels and annotations, the BuildJob as its controlling owner (in place of the
// environment), the job's pod's finalizers (none: only a BuildJob made by hand has one,
// and such a job takes no warm pod), and the job's deadline, counted
// from the pod's start rather than from now (activeDeadlineSeconds is from the pod's
// start, and a warm pod may have waited a while). The pod keeps LabelWarmPool, by which its
// pool counts it as assigned. now is the assignment's moment.
func AssignWarm(pod *corev1.Pod, job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, now time.Time) error {
	cold, err := Build(job, env, opts)
	if err != nil {
		return fmt.Errorf("the job's pod cannot be built: %w", err)
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	maps.Copy(pod.Labels, cold.Labels)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	maps.Copy(pod.Annotations, cold.Annotations)
	pod.OwnerReferences = cold.OwnerReferences
	for _, f := range cold.Finalizers {
		if !slices.Contains(pod.Finalizers, f) {
			pod.Finalizers = append(pod.Finalizers, f)
		}
	}
	if d := cold.Spec.ActiveDeadlineSeconds; d != nil {
		start := pod.CreationTimestamp.Time
		if pod.Status.StartTime != nil {
			start = pod.Status.StartTime.Time
		}
		waited := int64(0)
		if !start.IsZero() && now.After(start) {
			waited = int64(now.Sub(start).Round(time.Second) / time.Second)
		}
		pod.Spec.ActiveDeadlineSeconds = ptr(*d + waited)
	}
	return nil
}

// HandoffEnv is the job's environment as its own pod's job container would have it, for
// its warm pod's supervisor: each variable of Build's job container, in order, with the
// value the kubelet would give it. A literal value is expanded as the kubelet expands it
// ("$$" is "$", "$(NAME)" an earlier variable's value); a value from the job's token
// Secret (tokenSecret) is read from it. A value from anywhere else (the pod's own fields)
// is left out: the warm pod, built from the same environment, has the same definition, and
// the kubelet gave it the warm pod's own value, which is the one the job runs with.
func HandoffEnv(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, tokenSecret *corev1.Secret) (map[string]string, error) {
	cold, err := Build(job, env, opts)
	if err != nil {
		return nil, fmt.Errorf("the job's pod cannot be built: %w", err)
	}
	var vars []corev1.EnvVar
	for _, c := range cold.Spec.Containers {
		if c.Name == podcontract.JobContainer {
			vars = c.Env
		}
	}
	out := map[string]string{}
	for _, v := range vars {
		switch ref := secretRef(v); {
		case v.ValueFrom == nil:
			out[v.Name] = podcontract.Expand(v.Value, out)
		case ref != nil && tokenSecret != nil && ref.Name == tokenSecret.Name:
			val, ok := tokenSecret.Data[ref.Key]
			if !ok {
				if ref.Optional != nil && *ref.Optional {
					continue
				}
				return nil, fmt.Errorf("variable %s: the job's token Secret %s has no key %q", v.Name, tokenSecret.Name, ref.Key)
			}
			out[v.Name] = string(val)
		}
	}
	return out, nil
}

func secretRef(v corev1.EnvVar) *corev1.SecretKeySelector {
	if v.ValueFrom == nil {
		return nil
	}
	return v.ValueFrom.SecretKeyRef
}
