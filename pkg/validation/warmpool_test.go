package validation_test

import (
	"fmt"
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

// maxSize sets spec.warmPool.maxSize of a pool that warmPool made.
func maxSize(n int32) gen.BuildEnvironmentModifier {
	return func(e *bkv1.BuildEnvironment) { e.Spec.WarmPool.MaxSize = &n }
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
			name:     "a ceiling: it needs the API token",
			env:      []gen.BuildEnvironmentModifier{warmPool(2, 0), maxSize(5)},
			warnings: []string{demandWarning(2, 5)},
		},
		{
			name:     "a ceiling of 20 over no floor",
			env:      []gen.BuildEnvironmentModifier{warmPool(0, 0), maxSize(20)},
			warnings: []string{demandWarning(0, 20)},
		},
		{name: "a ceiling at the floor follows nothing, and needs no token", env: []gen.BuildEnvironmentModifier{warmPool(3, 0), maxSize(3)}},
		{name: "no pool at all", env: []gen.BuildEnvironmentModifier{warmPool(0, 0), maxSize(0)}},
		{
			name: "a ceiling below the floor",
			env:  []gen.BuildEnvironmentModifier{warmPool(4, 0), maxSize(2)},
			want: []string{`spec.warmPool.maxSize: Invalid value: 2: must be from size (4, the pool's floor) to 20: the pool's ceiling, up to which it grows while jobs wait for an agent; leave it out for a pool of always size pods`},
		},
		{
			name: "a ceiling too high",
			env:  []gen.BuildEnvironmentModifier{warmPool(1, 0), maxSize(21)},
			want: []string{`spec.warmPool.maxSize: Invalid value: 21: must be from size (1, the pool's floor) to 20`},
		},
		{
			name: "a negative ceiling",
			env:  []gen.BuildEnvironmentModifier{warmPool(0, 0), maxSize(-1)},
			want: []string{`spec.warmPool.maxSize: Invalid value: -1: must be from size (0, the pool's floor) to 20`},
		},
		{
			name: "a pool that follows demand in an environment whose jobs all start cold",
			env:  []gen.BuildEnvironmentModifier{warmPool(0, 0), maxSize(4), withEnv(corev1.EnvVar{Name: "DB_PASSWORD", ValueFrom: secretRef})},
			warnings: []string{
				`spec.warmPool: every job of this environment will start cold, in a new pod, and none in its 0 to 4 warm pods: spec.env[0] (DB_PASSWORD) takes its value from key "password" of Secret "db", which the kubelet reads when a warm pod starts, before it has a job; give the value in spec.env itself, or take it from a ConfigMap or Secret through spec.envFrom`,
				demandWarning(0, 4),
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

// demandWarning is the webhook's warning for a pool that follows demand.
func demandWarning(size, maxSize int32) string {
	return fmt.Sprintf("spec.warmPool.maxSize: the pool grows past its size (%d) up to %d only while the operator can read the jobs waiting on its queue from Buildkite's REST API: "+
		"that takes a Buildkite API token with the read_builds scope (agentd's --buildkite-api-token-file, the chart's buildkite.preflight.apiTokenSecret). "+
		"Without one the pool stays at %d; status.warmPool.message says when it does", size, maxSize, size)
}

func TestWarmPoolBounds(t *testing.T) {
	i := func(n int32) *int32 { return &n }
	for _, tc := range []struct {
		name           string
		pool           *bkv1.WarmPool
		floor, ceiling int32
		follows        bool
	}{
		{name: "no pool"},
		{name: "a fixed pool", pool: &bkv1.WarmPool{Size: 3}, floor: 3, ceiling: 3},
		{name: "a floor and a ceiling", pool: &bkv1.WarmPool{Size: 1, MaxSize: i(6)}, floor: 1, ceiling: 6, follows: true},
		{name: "a ceiling at the floor", pool: &bkv1.WarmPool{Size: 2, MaxSize: i(2)}, floor: 2, ceiling: 2},
		{name: "no floor, a ceiling: a pool while jobs wait", pool: &bkv1.WarmPool{MaxSize: i(3)}, floor: 0, ceiling: 3, follows: true},
		{name: "a pool of none", pool: &bkv1.WarmPool{MaxSize: i(0)}},
		{name: "an unchecked ceiling below the floor keeps the floor", pool: &bkv1.WarmPool{Size: 4, MaxSize: i(1)}, floor: 4, ceiling: 4},
		{name: "an unchecked ceiling above 20 is cut to 20", pool: &bkv1.WarmPool{Size: 2, MaxSize: i(50)}, floor: 2, ceiling: 20, follows: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.floor, tc.pool.Floor())
			assert.Equal(t, tc.ceiling, tc.pool.Ceiling())
			assert.Equal(t, tc.follows, tc.pool.FollowsDemand())
			spec := bkv1.BuildEnvironmentSpec{WarmPool: tc.pool}
			assert.Equal(t, tc.floor, spec.WarmPoolSize())
			assert.Equal(t, tc.ceiling > 0, spec.HasWarmPool())
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
