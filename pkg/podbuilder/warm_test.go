package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

func warmOpts() Options {
	return Options{
		AgentEndpoint:      "https://agent.buildkite.com/v3",
		PodSecurity:        PodSecurityRestricted,
		HandoffURL:         "https://agentd.buildkite-operator.svc:8443/handoff",
		HandoffAudience:    "buildkite-operator.buildkite-operator.handoff",
		HandoffCAConfigMap: "agentd-handoff-ca",
	}
}

// warmEnv is an environment with a pool, of generation 3, with a default timeout, its own
// env, labels and annotations, and a git SSH key.
func warmEnv() *bkv1.BuildEnvironment {
	env := baseEnv()
	env.UID = "5d1e0000-0000-4000-8000-00000000e0e0"
	env.Generation = 3
	env.Spec.WarmPool = &bkv1.WarmPool{Size: 2}
	env.Spec.Timeouts.DefaultMinutes = ptr(int32(20))
	env.Spec.Env = []corev1.EnvVar{{Name: "GOFLAGS", Value: "-mod=readonly"}}
	env.Spec.PodLabels = map[string]string{"team": "payments"}
	env.Spec.PodAnnotations = map[string]string{"cost-center": "42"}
	env.Spec.Allow.Secrets = []string{"deploy-key"}
	env.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "deploy-key"}
	return env
}

func jobContainerOf(t *testing.T, pod *corev1.Pod) corev1.Container {
	t.Helper()
	require.Len(t, pod.Spec.Containers, 1)
	require.Equal(t, podcontract.JobContainer, pod.Spec.Containers[0].Name)
	return pod.Spec.Containers[0]
}

func TestBuildWarm(t *testing.T) {
	env := warmEnv()
	pod, err := BuildWarm(env, warmOpts(), "go-warm-abcde")
	require.NoError(t, err)

	assert.Equal(t, "go-warm-abcde", pod.Name)
	assert.Equal(t, "ci", pod.Namespace)
	assert.Equal(t, map[string]string{LabelManagedBy: ManagedBy, LabelWarmPool: "go", "team": "payments"}, pod.Labels, "the environment's labels and the pool's, none of a job")
	assert.Equal(t, "3", pod.Annotations[AnnotationEnvironmentGeneration])
	assert.Equal(t, "42", pod.Annotations["cost-center"])
	assert.Len(t, pod.Annotations[AnnotationWarmTemplate], 64)
	assert.NotContains(t, pod.Annotations, AnnotationBuildURL)
	assert.Equal(t, []metav1.OwnerReference{{
		APIVersion: bkv1.GroupVersion.String(), Kind: "BuildEnvironment", Name: "go", UID: env.UID, Controller: ptr(true),
	}}, pod.OwnerReferences, "owned by its environment, not by a BuildJob")
	assert.Empty(t, pod.Finalizers, "the assignment adds the finalizer")
	assert.Nil(t, pod.Spec.ActiveDeadlineSeconds, "the environment's default timeout is a job's: set on assignment")

	c := jobContainerOf(t, pod)
	for _, name := range []string{
		podcontract.EnvJobID, podcontract.EnvCommand, podcontract.EnvAccessToken, podcontract.EnvEndpoint,
		podcontract.EnvPodMarker, podcontract.EnvLocal, podcontract.EnvJobEnvNames, podcontract.EnvTimeoutSeconds,
		podcontract.EnvChunkMaxBytes, "BUILDKITE_BRANCH",
	} {
		assert.Nil(t, envVar(c.Env, name), "a warm pod has no %s: only a job knows it", name)
	}
	for _, e := range c.Env {
		assert.Nil(t, e.ValueFrom, "%s refers to a Secret: a warm pod has no job token Secret", e.Name)
	}
	assert.Empty(t, c.EnvFrom)
	want := map[string]string{
		"GOFLAGS":                       "-mod=readonly",
		podcontract.EnvRunner:           string(bkv1.RunnerCommand),
		podcontract.EnvHandoffURL:       "https://agentd.buildkite-operator.svc:8443/handoff",
		podcontract.EnvHandoffTokenPath: validation.HandoffPath + "/token",
		podcontract.EnvHandoffCAPath:    validation.HandoffPath + "/ca.crt",
		"BUILDKITE_SSH_KEYSCAN":         "false", // the environment's git settings
	}
	for name, value := range want {
		if v := envVar(c.Env, name); assert.NotNil(t, v, name) {
			assert.Equal(t, value, v.Value, name)
		}
	}

	handoff := volume(pod, validation.VolumeHandoff)
	require.NotNil(t, handoff)
	require.NotNil(t, handoff.Projected)
	assert.Equal(t, []corev1.VolumeProjection{
		{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: warmOpts().HandoffAudience, ExpirationSeconds: ptr(int64(3600)), Path: "token"}},
		{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "agentd-handoff-ca"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
	}, handoff.Projected.Sources)
	assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: validation.VolumeHandoff, MountPath: validation.HandoffPath, ReadOnly: true})
	for _, ic := range pod.Spec.InitContainers {
		for _, m := range ic.VolumeMounts {
			assert.NotEqual(t, validation.VolumeHandoff, m.Name, "only the job container gets the hand-off token, not %s", ic.Name)
		}
	}
	assert.False(t, *pod.Spec.AutomountServiceAccountToken, "no Kubernetes API token: the projected one is good for the hand-off only")

	// The rest is the pod of a job of the environment, built by the same code.
	cold, err := Build(baseJob(), env, warmOpts())
	require.NoError(t, err)
	assert.Equal(t, jobView(&cold.Spec), jobView(&pod.Spec))
	assert.Equal(t, cold.Spec.Containers[0].Resources, c.Resources)
}

func TestBuildWarmWithoutCAConfigMap(t *testing.T) {
	opts := warmOpts()
	opts.HandoffCAConfigMap = ""
	pod, err := BuildWarm(warmEnv(), opts, "w")
	require.NoError(t, err)
	sources := volume(pod, validation.VolumeHandoff).Projected.Sources
	require.Len(t, sources, 1, "the token alone: the supervisor trusts the system's roots")
	assert.NotNil(t, sources[0].ServiceAccountToken)
	assert.Nil(t, envVar(jobContainerOf(t, pod).Env, podcontract.EnvHandoffCAPath))
}

func TestBuildWarmRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(env *bkv1.BuildEnvironment, opts *Options)
		podName string
		want    string
	}{
		{name: "no name", want: "needs a name"},
		{name: "no hand-off URL", podName: "w", change: func(_ *bkv1.BuildEnvironment, o *Options) { o.HandoffURL = "" },
			want: "BuildEnvironment go asks for a warm pool, but the operator has no hand-off endpoint URL"},
		{name: "plain http", podName: "w", change: func(_ *bkv1.BuildEnvironment, o *Options) { o.HandoffURL = "http://agentd:8080/handoff" },
			want: `the hand-off endpoint URL "http://agentd:8080/handoff" is not an https URL`},
		{name: "no audience", podName: "w", change: func(_ *bkv1.BuildEnvironment, o *Options) { o.HandoffAudience = "" },
			want: "no audience for the warm pods' hand-off tokens"},
		{name: "the hand-off volume's name", podName: "w", change: func(e *bkv1.BuildEnvironment, _ *Options) {
			e.Spec.Volumes = []corev1.Volume{{Name: validation.VolumeHandoff, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}, want: `has a volume named "agentd-handoff"`},
		{name: "no image", podName: "w", change: func(e *bkv1.BuildEnvironment, _ *Options) { e.Spec.Image = "" },
			want: "has no spec.image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, opts := warmEnv(), warmOpts()
			if tc.change != nil {
				tc.change(env, &opts)
			}
			_, err := BuildWarm(env, opts, tc.podName)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// apiDefaults fills in some of what the API server adds to a pod it stores.
func apiDefaults(pod *corev1.Pod) {
	pod.Spec.DNSPolicy = corev1.DNSClusterFirst
	pod.Spec.SchedulerName = corev1.DefaultSchedulerName
	pod.Spec.ServiceAccountName = "default"
	pod.Spec.NodeName = "node-1"
	pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))})
	for i := range pod.Spec.InitContainers {
		pod.Spec.InitContainers[i].TerminationMessagePath = corev1.TerminationMessagePathDefault
		pod.Spec.InitContainers[i].ImagePullPolicy = corev1.PullIfNotPresent
	}
	pod.Spec.Volumes[len(pod.Spec.Volumes)-1].Projected.DefaultMode = ptr(int32(0o644))
	pod.UID = "0d0d0000-0000-4000-8000-000000000001"
}
