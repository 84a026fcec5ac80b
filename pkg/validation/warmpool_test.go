package validation_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

func warmPool(size int32, maxIdle time.Duration) gen.BuildEnvironmentModifier {
	return func(e *bkv1.BuildEnvironment) {
		e.Spec.WarmPool = &bkv1.WarmPool{Size: size}
		if maxIdle != 0 {
			e.Spec.WarmPool.MaxIdle = &metav1.Duration{Duration: maxIdle}
		}
	}
}

// withEnv sets the environment's spec.env, allowing the Secret db it may read.
func withEnv(vars ...corev1.EnvVar) gen.BuildEnvironmentModifier {
	return func(e *bkv1.BuildEnvironment) {
		e.Spec.Env = vars
		e.Spec.Allow.Secrets = []string{"db"}
	}
}

func TestWarmPool(t *testing.T) {
	emptyDir := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	secretRef := &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "password"}}
	for _, tc := range []struct {
		name     string
		env      []gen.BuildEnvironmentModifier
		want     []string
		warnings []string
	}{
		{name: "no pool"},
		{name: "a pool with the default maxIdle", env: []gen.BuildEnvironmentModifier{warmPool(2, 0)}},
		{name: "the bounds", env: []gen.BuildEnvironmentModifier{warmPool(20, 24*time.Hour)}},
		{name: "the lower bounds", env: []gen.BuildEnvironmentModifier{warmPool(0, time.Minute)}},
		{
			name: "too large, too short",
			env:  []gen.BuildEnvironmentModifier{warmPool(21, 30*time.Second)},
			want: []string{
				`spec.warmPool.size: Invalid value: 21: must be from 0 (no warm pods) to 20; a larger pool holds more of the cluster than any queue this environment serves needs`,
				`spec.warmPool.maxIdle: Invalid value: "30s": must be from 1m to 24h, such as 30m (the default when unset): how long a warm pod waits for a job before it is replaced with a fresh one`,
			},
		},
		{
			name: "negative, too long",
			env:  []gen.BuildEnvironmentModifier{warmPool(-1, 25*time.Hour)},
			want: []string{
				`spec.warmPool.size: Invalid value: -1: must be from 0 (no warm pods) to 20`,
				`spec.warmPool.maxIdle: Invalid value: "25h0m0s": must be from 1m to 24h`,
			},
		},
		{
			name: "a reference to a job's variable",
			env:  []gen.BuildEnvironmentModifier{warmPool(2, 0), withEnv(corev1.EnvVar{Name: "A", Value: "1"}, corev1.EnvVar{Name: "REF", Value: "refs/heads/$(BUILDKITE_BRANCH)"})},
			warnings: []string{
				`spec.warmPool: every job of this environment will start cold, in a new pod, and none in its 2 warm pods: spec.env[1] (REF) refers to another variable with $(...), which the kubelet expands when a warm pod starts, before it has a job's variables; write the value out, or build it in the job's command (escape a literal $( as $$( )`,
			},
		},
		{
			name: "valueFrom a Secret",
			env:  []gen.BuildEnvironmentModifier{warmPool(1, 0), withEnv(corev1.EnvVar{Name: "DB_PASSWORD", ValueFrom: secretRef})},
			warnings: []string{
				`spec.warmPool: every job of this environment will start cold, in a new pod, and none in its 1 warm pods: spec.env[0] (DB_PASSWORD) takes its value from key "password" of Secret "db", which the kubelet reads when a warm pod starts, before it has a job; give the value in spec.env itself, or take it from a ConfigMap or Secret through spec.envFrom`,
			},
		},
		{
			name: "no pool, no warning",
			env:  []gen.BuildEnvironmentModifier{warmPool(0, 0), withEnv(corev1.EnvVar{Name: "DB_PASSWORD", ValueFrom: secretRef})},
		},
		{
			name: "an escaped $( is no reference",
			env:  []gen.BuildEnvironmentModifier{warmPool(2, 0), withEnv(corev1.EnvVar{Name: "A", Value: "$$(not) $( $() a$b $"})},
		},
		{
			name: "the hand-off volume's name and path",
			env: []gen.BuildEnvironmentModifier{func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{{Name: "agentd-handoff", VolumeSource: emptyDir}, {Name: "cache", VolumeSource: emptyDir}}
				e.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/var/run/buildkite-operator/handoff/"}}
			}},
			want: []string{
				`spec.volumes[0].name: Invalid value: "agentd-handoff": "agentd-handoff" is reserved for a volume the operator adds to every job pod; choose another name`,
				`spec.volumeMounts[0].mountPath: Invalid value: "/var/run/buildkite-operator/handoff/": /var/run/buildkite-operator/handoff is where the operator mounts a warm pod's hand-off token in the job's container; mount this volume elsewhere`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, warnings := validation.BuildEnvironment(testEnv(tc.env...))
			got := messages(errs)
			assert.Len(t, got, len(tc.want), "%v", got)
			for i := range min(len(got), len(tc.want)) {
				assert.Contains(t, got[i], tc.want[i])
			}
			assert.Equal(t, tc.warnings, warnings)
		})
	}
}

func TestColdEnv(t *testing.T) {
	for _, tc := range []struct {
		value string
		cold  bool
	}{
		{"plain", false},
		{"$(HOME)/bin", true},
		{"a$(B)", true},
		{"$$$(B)", true},
		{"$$(B)", false},
		{"$(", false},
		{"$()", false},
		{"$(B", false},
		{"$", false},
		{"cost: $5 (approx)", false},
		{"$(A B)", false},
		{"$($(B))", true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			env := testEnv(withEnv(corev1.EnvVar{Name: "X", Value: tc.value}))
			assert.Equal(t, tc.cold, validation.ColdEnv(env) != "")
		})
	}
}
