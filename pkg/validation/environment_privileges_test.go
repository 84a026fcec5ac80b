package validation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// The volume, claim, priority and toleration gates leave alone what any pod has: a claim of
// its own, the node-condition tolerations Kubernetes gives every pod, and a key that "*"
// allows.
func TestSchedulingAndStorageNotGated(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  gen.BuildEnvironmentModifier
	}{
		{"an ephemeral volume and a workspace claim of the pod's own", func(e *bkv1.BuildEnvironment) {
			claim := &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			}}
			e.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: claim}}}}
			e.Spec.Workspace = bkv1.Workspace{VolumeClaimTemplate: claim}
		}},
		{"the tolerations of unreachable and not-ready nodes every pod gets", func(e *bkv1.BuildEnvironment) {
			e.Spec.Tolerations = []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)},
			}
		}},
		{`a taint key allowed by "*"`, func(e *bkv1.BuildEnvironment) {
			e.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "a100", Effect: corev1.TaintEffectNoSchedule}}
			e.Spec.Allow.Tolerations = []string{"*"}
		}},
		{"a CSI volume without a Secret", func(e *bkv1.BuildEnvironment) {
			e.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "cache.example.com"}}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(tc.set)
			assert.Empty(t, messages(validation.Privileges(env)))
			errs, _ := validation.BuildEnvironment(env)
			assert.Empty(t, messages(errs))
		})
	}
}

// EnvironmentPrivileges names what an environment gives its pods, allowed or not, once
// each and in the order of the spec; EnvironmentSecrets lists the Secrets among them.
func TestEnvironmentPrivileges(t *testing.T) {
	secretKey := func(name string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "k"}}
	}
	for _, tc := range []struct {
		name        string
		set         gen.BuildEnvironmentModifier
		want        []string
		wantSecrets []string
	}{
		{name: "nothing", set: func(*bkv1.BuildEnvironment) {}},
		{
			name: "Secrets, pull secrets and a service account",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Env = []corev1.EnvVar{{Name: "A", ValueFrom: secretKey("db")}, {Name: "B", ValueFrom: secretKey("db")}}
				e.Spec.Volumes = []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
					Driver: "secrets-store.csi.k8s.io", NodePublishSecretRef: &corev1.LocalObjectReference{Name: "vault"},
				}}}}
				e.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}, {Name: "db"}}
				e.Spec.ServiceAccountName = "deployer"
				e.Spec.AutomountServiceAccountToken = true
				e.Spec.Allow = bkv1.Allow{Secrets: []string{"db", "vault"}, ServiceAccount: true}
			},
			want:        []string{`Secret "db"`, `Secret "vault"`, `service account "deployer"`, "a Kubernetes API token", `Secret "registry"`},
			wantSecrets: []string{"db", "vault", "registry"},
		},
		{
			name: "the node, a claim, a priority, tolerations",
			set: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true), Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"CHOWN", "cap_sys_admin"}}}
				e.Spec.Volumes = []corev1.Volume{
					{Name: "docker", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/docker.sock"}}},
					{Name: "cache", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "cache"}}},
				}
				e.Spec.PriorityClassName = "ci-large"
				e.Spec.Tolerations = []corev1.Toleration{{Key: "pool", Operator: corev1.TolerationOpExists}, {Operator: corev1.TolerationOpExists}}
			},
			want: []string{"privileged containers", "capability SYS_ADMIN", "hostPath volumes", `PersistentVolumeClaim "cache"`,
				`priority class "ci-large"`, `toleration of taint "pool"`, "tolerating every taint"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testEnv(tc.set)
			assert.Equal(t, tc.want, validation.EnvironmentPrivileges(env))
			assert.Equal(t, tc.wantSecrets, validation.EnvironmentSecrets(env))
		})
	}
}
