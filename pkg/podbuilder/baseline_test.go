package podbuilder

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// baselineProblems judges pod as Kubernetes' Pod Security admission does at the Baseline
// level (the checks of k8s.io/pod-security-admission, not a copy of them): "" when it
// would be admitted, else why not.
func baselineProblems(t testing.TB, pod *corev1.Pod) string {
	t.Helper()
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	require.NoError(t, err)
	lv := psaapi.LevelVersion{Level: psaapi.LevelBaseline, Version: psaapi.LatestVersion()}
	res := policy.AggregateCheckResults(evaluator.EvaluatePod(lv, &pod.ObjectMeta, &pod.Spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenReason() + ": " + res.ForbiddenDetail()
}

// An environment that allows nothing gives its pods no privilege: whatever it sets, a pod
// that Build builds from it meets the Baseline Pod Security Standard. Each case is a
// setting that Baseline forbids; Build must refuse it (saying which allow would let it) or
// build a pod without it.
func TestBuildWithoutAllowsMeetsBaseline(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*bkv1.BuildEnvironmentSpec)
	}{
		{"nothing set", func(*bkv1.BuildEnvironmentSpec) {}},
		{"SELinux type spc_t (a super-privileged container)", func(s *bkv1.BuildEnvironmentSpec) {
			s.SecurityContext = &corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t"}}
		}},
		{"SELinux user on the pod", func(s *bkv1.BuildEnvironmentSpec) {
			s.PodSecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{User: "system_u"}}
		}},
		{"SELinux role on a sidecar", func(s *bkv1.BuildEnvironmentSpec) {
			s.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", SecurityContext: &corev1.SecurityContext{
				SELinuxOptions: &corev1.SELinuxOptions{Role: "sysadm_r"}}}}
		}},
		{"an unsafe sysctl", func(s *bkv1.BuildEnvironmentSpec) {
			s.PodSecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.msgmax", Value: "65536"}}}
		}},
		{"a capability in lower case", func(s *bkv1.BuildEnvironmentSpec) {
			s.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"sys_admin"}}}
		}},
		{"a capability with its CAP_ prefix", func(s *bkv1.BuildEnvironmentSpec) {
			s.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"CAP_NET_ADMIN"}}}
		}},
		{"a default capability spelled as the runtime reads it", func(s *bkv1.BuildEnvironmentSpec) {
			s.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"cap_chown"}}}
		}},
		{"AppArmor unconfined on an init container", func(s *bkv1.BuildEnvironmentSpec) {
			s.InitContainers = []corev1.Container{{Name: "prep", Image: "busybox:1.37", SecurityContext: &corev1.SecurityContext{
				AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}}}}
		}},
		{"seccomp unconfined on the pod", func(s *bkv1.BuildEnvironmentSpec) {
			s.PodSecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
		}},
		{"a host port on a sidecar", func(s *bkv1.BuildEnvironmentSpec) {
			s.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", Ports: []corev1.ContainerPort{{ContainerPort: 5432, HostPort: 5432}}}}
		}},
		{"privileged", func(s *bkv1.BuildEnvironmentSpec) {
			s.SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			tc.set(&env.Spec)
			pod, err := Build(baseJob(), env, Options{PodSecurity: PodSecurityBaseline})
			if err != nil {
				assert.Contains(t, err.Error(), "spec.allow", "a refusal says which allow would let it")
				return
			}
			assert.Empty(t, baselineProblems(t, pod), "the pod Build made breaks Baseline")
		})
	}
}

// FuzzBuildWithoutAllows feeds arbitrary BuildEnvironment specs (as JSON, with spec.allow
// emptied) to Build: it must never panic, must explain every refusal, and every pod it
// builds must meet the Baseline Pod Security Standard as Kubernetes judges it.
func FuzzBuildWithoutAllows(f *testing.F) {
	f.Add([]byte(`{"image":"golang:1.26"}`))
	f.Add([]byte(`{"image":"golang:1.26","securityContext":{"capabilities":{"add":["NET_ADMIN"]},"seLinuxOptions":{"type":"container_t"}}}`))
	f.Add([]byte(`{"image":"x","podSecurityContext":{"sysctls":[{"name":"net.ipv4.ip_unprivileged_port_start","value":"0"}],"seccompProfile":{"type":"RuntimeDefault"}}}`))
	f.Add([]byte(`{"image":"x","sidecars":[{"name":"db","image":"postgres:17","ports":[{"containerPort":5432,"hostPort":1}],"securityContext":{"procMount":"Unmasked"}}],"volumes":[{"name":"h","hostPath":{"path":"/"}}]}`))
	f.Add([]byte(`{"image":"x","podAnnotations":{"container.apparmor.security.beta.kubernetes.io/job":"unconfined"},"initContainers":[{"name":"i","image":"y","securityContext":{"windowsOptions":{"hostProcess":true}}}]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		env := baseEnv()
		if json.Unmarshal(raw, &env.Spec) != nil {
			return
		}
		env.Spec.Allow = bkv1.Allow{}
		pod, err := Build(baseJob(), env, Options{PodSecurity: PodSecurityBaseline})
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a refusal without a reason")
			}
			return
		}
		if why := baselineProblems(t, pod); why != "" {
			t.Fatalf("an environment without allows got a pod that breaks Baseline: %s\nspec: %s", why, raw)
		}
	})
}
