package validation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation/validationtest"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// Each setting that needs a privilege is refused, in Privileges and in BuildEnvironment,
// until the environment allows it.
func TestPrivileges(t *testing.T) {
	for _, tc := range validationtest.PrivilegeCases() {
		t.Run(tc.Name, func(t *testing.T) {
			env := testEnv(tc.Set)
			assert.Equal(t, []string{tc.Want}, messages(validation.Privileges(env)))
			errs, _ := validation.BuildEnvironment(env)
			assert.Contains(t, messages(errs), tc.Want)

			tc.Allow(&env.Spec.Allow)
			assert.Empty(t, messages(validation.Privileges(env)), "with the allow")
			errs, _ = validation.BuildEnvironment(env)
			assert.Empty(t, messages(errs), "with the allow")
		})
	}
}

// What needs no allow: the settings of an ordinary build environment.
func TestPrivilegesNotNeeded(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  gen.BuildEnvironmentModifier
	}{
		{"privileged false", func(e *bkv1.BuildEnvironment) {
			e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false)}
		}},
		{"a capability of the default set, and dropping ALL", func(e *bkv1.BuildEnvironment) {
			e.Spec.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
				Add: []corev1.Capability{"NET_BIND_SERVICE", "cap_chown"}, Drop: []corev1.Capability{"ALL"},
			}}
		}},
		{"a non-root user, RuntimeDefault and Localhost profiles", func(e *bkv1.BuildEnvironment) {
			e.Spec.PodSecurityContext = &corev1.PodSecurityContext{
				RunAsUser: ptr.To[int64](1000), RunAsNonRoot: ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			}
			e.Spec.SecurityContext = &corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeRuntimeDefault}}
			e.Spec.PodAnnotations = map[string]string{"container.apparmor.security.beta.kubernetes.io/job": "runtime/default"}
		}},
		{"the default service account without a token", func(e *bkv1.BuildEnvironment) { e.Spec.ServiceAccountName = "default" }},
		{"a container port, ConfigMaps and an emptyDir", func(e *bkv1.BuildEnvironment) {
			e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", Ports: []corev1.ContainerPort{{ContainerPort: 5432}},
				EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "db"}}}}}}
			e.Spec.Volumes = []corev1.Volume{
				{Name: "hooks", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "hooks"}}}},
				{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			}
		}},
		{"image pull secrets are the kubelet's, not the job's", func(e *bkv1.BuildEnvironment) {
			e.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Empty(t, messages(validation.Privileges(testEnv(tc.set))))
		})
	}
}

func TestPrivilegeWarnings(t *testing.T) {
	env := testEnv(func(e *bkv1.BuildEnvironment) {
		e.Spec.Allow = bkv1.Allow{Privileged: true, HostPath: true}
	})
	_, warnings := validation.BuildEnvironment(env)
	assert.Contains(t, warnings, `spec.allow: privileged containers and hostPath volumes let any job of this environment take over its node; allow them only for pipelines you trust with the node (spec.allowedPipelines)`)
}
