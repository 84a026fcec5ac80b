package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// In a restricted namespace every container of the pod, the operator's own included, gets
// what the restricted Pod Security Standard requires where the environment set nothing; what
// the environment sets is kept; other levels change nothing. (examples_test has the API
// server's Pod Security admission accept such pods.)
func TestMeetPodSecurity(t *testing.T) {
	sidecar := func(env *bkv1.BuildEnvironment) {
		env.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17"}}
	}
	cases := []struct {
		name     string
		level    PodSecurityLevel
		change   func(env *bkv1.BuildEnvironment)
		wantUser *int64
		check    func(t *testing.T, pod *corev1.Pod)
	}{
		{name: "restricted fills in", level: PodSecurityRestricted, change: sidecar, wantUser: ptr(DefaultRestrictedUser),
			check: func(t *testing.T, pod *corev1.Pod) {
				psc := pod.Spec.SecurityContext
				assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
				assert.Equal(t, ptr(true), psc.RunAsNonRoot)
				assert.Equal(t, ptr(DefaultRestrictedUser), psc.FSGroup)
			}},
		{name: "restricted keeps the environment's user", level: PodSecurityRestricted, wantUser: ptr(int64(4242)),
			change: func(env *bkv1.BuildEnvironment) {
				env.Spec.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr(int64(4242))}
				env.Spec.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				job := pod.Spec.Containers[0].SecurityContext
				assert.Equal(t, []corev1.Capability{"NET_RAW", "ALL"}, job.Capabilities.Drop)
				assert.Nil(t, pod.Spec.SecurityContext.FSGroup, "the environment chose its user: its group is its own too")
			}},
		{name: "restricted leaves a container's own user alone", level: PodSecurityRestricted,
			change: func(env *bkv1.BuildEnvironment) {
				env.Spec.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(2000))}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				assert.Equal(t, ptr(int64(2000)), pod.Spec.Containers[0].SecurityContext.RunAsUser)
			}},
		{name: "restricted leaves a privileged container able to escalate, which the API server requires",
			level: PodSecurityRestricted, wantUser: ptr(DefaultRestrictedUser),
			change: func(env *bkv1.BuildEnvironment) {
				env.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
				env.Spec.Allow.Privileged = true
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				// privileged with allowPrivilegeEscalation false is an invalid pod; left alone,
				// the namespace's Pod Security admission refuses it with a message that says why.
				assert.Nil(t, pod.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation)
			}},
		{name: "baseline changes nothing", level: PodSecurityBaseline, change: sidecar,
			check: func(t *testing.T, pod *corev1.Pod) {
				assert.Nil(t, pod.Spec.SecurityContext)
				for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
					assert.Nil(t, c.SecurityContext, c.Name)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			if tc.change != nil {
				tc.change(env)
			}
			pod, err := Build(baseJob(), env, Options{PodSecurity: tc.level})
			require.NoError(t, err)
			if tc.level == PodSecurityRestricted {
				assert.Equal(t, tc.wantUser, pod.Spec.SecurityContext.RunAsUser)
				for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
					require.NotNil(t, c.SecurityContext, c.Name)
					if !ptrTrue(c.SecurityContext.Privileged) {
						assert.Equal(t, ptr(false), c.SecurityContext.AllowPrivilegeEscalation, c.Name)
					}
					assert.Contains(t, c.SecurityContext.Capabilities.Drop, corev1.Capability("ALL"), c.Name)
				}
			}
			tc.check(t, pod)
		})
	}
}

func TestParsePodSecurityLevel(t *testing.T) {
	for _, ok := range []string{"restricted", "baseline", "privileged"} {
		l, err := ParsePodSecurityLevel(ok)
		require.NoError(t, err)
		assert.Equal(t, PodSecurityLevel(ok), l)
	}
	_, err := ParsePodSecurityLevel("Restricted")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "use restricted, baseline or privileged")
}

func ptrTrue(b *bool) bool { return b != nil && *b }
