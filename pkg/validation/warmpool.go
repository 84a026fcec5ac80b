package validation

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// checkWarmPool checks spec.warmPool (its size and maxSize, which the CRD schema bounds
// too, and maxIdle) and warns when the environment keeps a pool its jobs can never use, and
// that a pool that follows demand needs the operator's Buildkite API token.
func checkWarmPool(spec *field.Path, env *bkv1.BuildEnvironment) (field.ErrorList, []string) {
	w := env.Spec.WarmPool
	if w == nil {
		return nil, nil
	}
	p := spec.Child("warmPool")
	var errs field.ErrorList
	if w.Size < 0 || w.Size > bkv1.WarmPoolMaxSize {
		errs = append(errs, field.Invalid(p.Child("size"), w.Size, fmt.Sprintf(
			"must be from 0 (no warm pods) to %d; a larger pool holds more of the cluster than any queue this environment serves needs", bkv1.WarmPoolMaxSize)))
	}
	if m := w.MaxSize; m != nil && (*m < w.Size || *m > bkv1.WarmPoolMaxSize) {
		errs = append(errs, field.Invalid(p.Child("maxSize"), *m, fmt.Sprintf(
			"must be from size (%d, the pool's floor) to %d: the pool's ceiling, up to which it grows while jobs wait for an agent; leave it out for a pool of always size pods",
			w.Size, bkv1.WarmPoolMaxSize)))
	}
	if m := w.MaxIdle; m != nil && (m.Duration < bkv1.MinWarmPoolMaxIdle || m.Duration > bkv1.MaxWarmPoolMaxIdle) {
		errs = append(errs, field.Invalid(p.Child("maxIdle"), m.Duration.String(),
			"must be from 1m to 24h, such as 30m (the default when unset): how long a warm pod waits for a job before it is replaced with a fresh one"))
	}
	var warnings []string
	if w.Ceiling() > 0 {
		if why := ColdEnv(env); why != "" {
			warnings = append(warnings, fmt.Sprintf(
				"spec.warmPool: every job of this environment will start cold, in a new pod, and none in its %s warm pods: %s", poolSize(w), why))
		}
	}
	if w.MaxSize != nil && *w.MaxSize > w.Size && *w.MaxSize <= bkv1.WarmPoolMaxSize {
		warnings = append(warnings, fmt.Sprintf(
			"spec.warmPool.maxSize: the pool grows past its size (%d) up to %d only while the operator can read the jobs waiting on its queue from Buildkite's REST API: "+
				"that takes a Buildkite API token with the read_builds scope (agentd's --buildkite-api-token-file, the chart's buildkite.preflight.apiTokenSecret). "+
				"Without one the pool stays at %d; status.warmPool.message says when it does",
			w.Size, *w.MaxSize, w.Size))
	}
	return errs, warnings
}

// poolSize is the pool's size for a message: "2", or "2 to 5" when it follows demand.
func poolSize(w *bkv1.WarmPool) string {
	if w.FollowsDemand() {
		return fmt.Sprintf("%d to %d", w.Size, w.Ceiling())
	}
	return fmt.Sprint(w.Size)
}

// ColdEnv says why no job of env can start in a warm pod because of its spec.env, the env
// of the job's container, or "" when nothing there keeps it out. The kubelet resolves a
// $(VAR) reference and a valueFrom when it starts the container: in a warm pod that is
// before its job is known, so a reference to a job's variable, or a fieldRef to the pod's
// name or labels, would give the warm pod's value and not the job's. The pod builder
// (podbuilder.WarmFits) sends such jobs cold; the webhook warns about it.
func ColdEnv(env *bkv1.BuildEnvironment) string {
	p := field.NewPath("spec", "env")
	for i, e := range env.Spec.Env {
		switch {
		case e.ValueFrom != nil:
			return fmt.Sprintf(
				"%s (%s) takes its value from %s, which the kubelet reads when a warm pod starts, before it has a job; give the value in spec.env itself, or take it from a ConfigMap or Secret through spec.envFrom",
				p.Index(i), e.Name, valueFromKind(e.ValueFrom))
		case referencesVariable(e.Value):
			return fmt.Sprintf(
				"%s (%s) refers to another variable with $(...), which the kubelet expands when a warm pod starts, before it has a job's variables; write the value out, or build it in the job's command (escape a literal $( as $$( )",
				p.Index(i), e.Name)
		}
	}
	return ""
}

func valueFromKind(v *corev1.EnvVarSource) string {
	switch {
	case v.FieldRef != nil:
		return "the pod's field " + v.FieldRef.FieldPath
	case v.ResourceFieldRef != nil:
		return "the container's " + v.ResourceFieldRef.Resource
	case v.SecretKeyRef != nil:
		return fmt.Sprintf("key %q of Secret %q", v.SecretKeyRef.Key, v.SecretKeyRef.Name)
	case v.ConfigMapKeyRef != nil:
		return fmt.Sprintf("key %q of ConfigMap %q", v.ConfigMapKeyRef.Key, v.ConfigMapKeyRef.Name)
	}
	return "valueFrom"
}

// referencesVariable reports whether the kubelet would read value as referring to a
// variable: "$(" followed by a name and ")", not escaped as "$$(". A "name" with a "$" or
// a space in it is taken as text: no variable is named so.
func referencesVariable(value string) bool {
	for i := 0; i < len(value)-1; i++ {
		if value[i] != '$' {
			continue
		}
		if value[i+1] == '$' {
			i++ // "$$" is a literal "$"
			continue
		}
		if value[i+1] != '(' {
			continue
		}
	name:
		for j := i + 2; j < len(value); j++ {
			switch value[j] {
			case ')':
				if j > i+2 {
					return true
				}
				break name
			case '$', ' ', '\t', '\n':
				break name
			}
		}
	}
	return false
}
