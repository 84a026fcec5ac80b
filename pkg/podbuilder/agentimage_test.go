package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// initContainer is the pod's init container called name; the test fails without one.
func initContainer(t *testing.T, pod *corev1.Pod, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return c
		}
	}
	require.Failf(t, "no init container", "the pod has no init container %q", name)
	return corev1.Container{}
}

// The agent comes from the operator's agent image unless the environment names its own;
// the environment's pull policy wins over the operator's, for either image. The operator's
// own init container only installs the supervisor.
func TestAgentImage(t *testing.T) {
	cases := []struct {
		name       string
		opts       Options
		agent      bkv1.AgentSettings
		wantImage  string
		wantPolicy corev1.PullPolicy
	}{
		{name: "Buildkite's image by default", wantImage: DefaultAgentImage},
		{name: "the operator's", opts: Options{AgentImage: "mirror.example.com/buildkite/agent:3.138.1", AgentImagePullPolicy: corev1.PullIfNotPresent},
			wantImage: "mirror.example.com/buildkite/agent:3.138.1", wantPolicy: corev1.PullIfNotPresent},
		{name: "the environment's, with the operator's policy", opts: Options{AgentImage: "buildkite/agent:3.138.1", AgentImagePullPolicy: corev1.PullNever},
			agent:     bkv1.AgentSettings{Image: "buildkite/agent:3.138.1-ubuntu-24.04"},
			wantImage: "buildkite/agent:3.138.1-ubuntu-24.04", wantPolicy: corev1.PullNever},
		{name: "the environment's policy for the operator's image", opts: Options{AgentImagePullPolicy: corev1.PullIfNotPresent},
			agent:     bkv1.AgentSettings{ImagePullPolicy: corev1.PullAlways},
			wantImage: DefaultAgentImage, wantPolicy: corev1.PullAlways},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			env.Spec.Agent = tc.agent
			pod, err := Build(baseJob(), env, tc.opts)
			require.NoError(t, err)
			c := initContainer(t, pod, podcontract.AgentInstallContainer)
			assert.Equal(t, tc.wantImage, c.Image)
			assert.Equal(t, tc.wantPolicy, c.ImagePullPolicy)
			assert.Equal(t, []string{"/bin/sh", "-c", agentInstallScript, podcontract.AgentInstallContainer,
				podcontract.AgentImageBinaryPath, podcontract.AgentPath}, c.Command)
			assert.Empty(t, c.Args, "the image's entrypoint and command are replaced, not given arguments")
			assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: podcontract.BinVolume, MountPath: podcontract.BinDir})

			install := initContainer(t, pod, podcontract.InstallContainer)
			assert.Equal(t, []string{"install", "--supervisor", podcontract.ImageSupervisorPath, podcontract.SupervisorPath}, install.Args)
			assert.Equal(t, DefaultOperatorImage, install.Image)
		})
	}
}

// The agent images run as root: where the pod must not run as root but names no user, the
// agent's init container gets one, so the kubelet starts it; elsewhere it keeps the pod's.
func TestAgentInstallRunsAsNonRoot(t *testing.T) {
	cases := []struct {
		name  string
		level PodSecurityLevel
		set   func(*bkv1.BuildEnvironmentSpec)
		// want is the container's own runAsUser; nil when it takes the pod's.
		want *int64
	}{
		{name: "restricted: the pod's user", level: PodSecurityRestricted},
		{name: "restricted, the job container names its user", level: PodSecurityRestricted, want: ptr(DefaultRestrictedUser),
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(2000))}
			}},
		{name: "restricted, the environment names the pod's user", level: PodSecurityRestricted,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr(int64(2000))}
			}},
		{name: "baseline: root may copy", level: PodSecurityBaseline},
		{name: "baseline, the environment asks for no root", level: PodSecurityBaseline, want: ptr(DefaultRestrictedUser),
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.PodSecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true)}
			}},
		{name: "baseline, the environment allows root", level: PodSecurityBaseline,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.PodSecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(false)}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			if tc.set != nil {
				tc.set(&env.Spec)
			}
			pod, err := Build(baseJob(), env, Options{PodSecurity: tc.level})
			require.NoError(t, err)
			c := initContainer(t, pod, podcontract.AgentInstallContainer)
			var got *int64
			if c.SecurityContext != nil {
				got = c.SecurityContext.RunAsUser
			}
			assert.Equal(t, tc.want, got)
			if tc.level == PodSecurityRestricted {
				assert.Equal(t, ptr(false), c.SecurityContext.AllowPrivilegeEscalation)
				assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
				assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.Spec.SecurityContext.SeccompProfile.Type)
				assert.True(t, *pod.Spec.SecurityContext.RunAsNonRoot)
			}
		})
	}
}
