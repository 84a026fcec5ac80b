package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

func TestWarmFits(t *testing.T) {
	for _, tc := range []struct {
		name string
		// warmEnv changes the environment before its warm pod is made; later changes it
		// (and the job, and the options) after.
		warmEnv func(env *bkv1.BuildEnvironment)
		later   func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts *Options, warm *corev1.Pod)
		// want is "" when the job fits, else a part of why it does not.
		want string
	}{
		{name: "a plain job of the environment"},
		{name: "a warm pod read back from the API server, with its defaults", later: func(_ *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, w *corev1.Pod) {
			apiDefaults(w)
		}},
		{name: "what the hand-off carries or the assignment patches: env, timeout, log paths, endpoint", later: func(j *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			j.Spec.Env["MORE"] = "$(BUILDKITE_BRANCH)"
			j.Spec.EnvNames = []string{"SECRET_THING"}
			j.Spec.TimeoutMinutes = ptr(int32(90))
			j.Spec.LogPaths = []string{"/workspace/out.log"}
			j.Spec.AgentEndpoint = "https://agent.eu.buildkite.com/v3"
		}},
		{name: "made by hand", later: func(j *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) { handMade(j) }},
		{name: "sidecars, hooks and a claim for the workspace", warmEnv: func(e *bkv1.BuildEnvironment) {
			e.Spec.Runner = bkv1.RunnerBootstrap
			e.Spec.Sidecars = []corev1.Container{{Name: "postgres", Image: "postgres:17"}}
			e.Spec.Agent.HooksConfigMap = "ci-hooks"
			e.Spec.Workspace.VolumeClaimTemplate = &corev1.PersistentVolumeClaimTemplate{Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}},
			}}
		}},
		{name: "the job asks for its own resources", later: func(j *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			j.Spec.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}}
		}, want: "the job needs a pod of its own: the job asks for its own resources (requests cpu=4 memory=1Gi), the warm pod has its environment's (requests cpu=1 memory=1Gi)"},
		{name: "the environment changed since", later: func(_ *bkv1.BuildJob, e *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			e.Generation = 4
			e.Spec.Image = "golang:1.27"
		}, want: "BuildEnvironment go has changed since warm pod go-warm-1 was made from it (generation 3 then, 4 now)"},
		{name: "the operator's image changed since", later: func(_ *bkv1.BuildJob, _ *bkv1.BuildEnvironment, o *Options, _ *corev1.Pod) {
			o.OperatorImage = "bk-operator/agentd:v2"
		}, want: "its init container agentd-install would run image bk-operator/agentd:v2, the warm pod's runs bk-operator/agentd:dev, as the operator's settings have changed"},
		{name: "another hand-off audience", later: func(_ *bkv1.BuildJob, _ *bkv1.BuildEnvironment, o *Options, _ *corev1.Pod) {
			o.HandoffAudience = "another"
		}, want: `warm pod go-warm-1 was made for another hand-off endpoint, audience or CA than the operator's now (https://agentd.buildkite-operator.svc:8443/handoff, audience "another")`},
		{name: "a warm pod as the operator's cache keeps it: no env, no volumes", later: func(_ *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, w *corev1.Pod) {
			w.Spec.Volumes = nil
			for i := range w.Spec.Containers {
				w.Spec.Containers[i].Env, w.Spec.Containers[i].VolumeMounts = nil, nil
			}
		}},
		{name: "the job runs in another environment", later: func(j *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			j.Spec.BuildEnvironment = "node"
		}, want: "the job runs in BuildEnvironment node, not go"},
		{name: "a warm pod of another environment", later: func(j *bkv1.BuildJob, e *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			e.Name, e.UID = "node", "5d1e0000-0000-4000-8000-00000000e0e1"
			j.Spec.BuildEnvironment = "node"
		}, want: "warm pod go-warm-1 is in the pool of another BuildEnvironment (go), not of node"},
		{name: "an environment of the same name made again", later: func(_ *bkv1.BuildJob, e *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			e.UID = "5d1e0000-0000-4000-8000-00000000e0e2"
		}, want: "in the pool of another BuildEnvironment"},
		{name: "$(VAR) in the environment's env", warmEnv: func(e *bkv1.BuildEnvironment) {
			e.Spec.Env = append(e.Spec.Env, corev1.EnvVar{Name: "REF", Value: "refs/heads/$(BUILDKITE_BRANCH)"})
		}, want: "BuildEnvironment go's jobs all start cold: spec.env[1] (REF) refers to another variable with $(...)"},
		{name: "valueFrom in the environment's env", warmEnv: func(e *bkv1.BuildEnvironment) {
			e.Spec.Env = []corev1.EnvVar{{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
		}, want: "spec.env[0] (POD) takes its value from the pod's field metadata.name"},
		{name: "a warm pod being deleted", later: func(_ *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, w *corev1.Pod) {
			w.DeletionTimestamp = &metav1.Time{}
		}, want: "warm pod go-warm-1 is being deleted"},
		{name: "not a warm pod", later: func(_ *bkv1.BuildJob, _ *bkv1.BuildEnvironment, _ *Options, w *corev1.Pod) {
			delete(w.Annotations, AnnotationWarmTemplate)
		}, want: "pod go-warm-1 is not a warm pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, opts, job := warmEnv(), warmOpts(), baseJob()
			job.Spec.BuildEnvironment = "go"
			env.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}
			if tc.warmEnv != nil {
				tc.warmEnv(env)
			}
			warm, err := BuildWarm(env, opts, "go-warm-1")
			require.NoError(t, err)
			if tc.later != nil {
				tc.later(job, env, &opts, warm)
			}
			ok, why := WarmFits(job, env, opts, warm)
			if tc.want == "" {
				assert.True(t, ok, why)
				assert.Empty(t, why)
				return
			}
			assert.False(t, ok)
			assert.Contains(t, why, tc.want)
		})
	}
}

// WarmFits compares whole specs: a difference in any field of the job's pod that is not
// the hand-off's or the assignment's sends the job cold, and says where.
func TestWarmFitsComparesWholeSpecs(t *testing.T) {
	env, opts := warmEnv(), warmOpts()
	cold, err := Build(baseJob(), env, opts)
	require.NoError(t, err)
	warm, err := BuildWarm(env, opts, "w")
	require.NoError(t, err)
	require.Empty(t, specDifference(jobView(&cold.Spec), jobView(&warm.Spec)))

	for _, tc := range []struct {
		name   string
		change func(spec *corev1.PodSpec)
		want   string
	}{
		{"priority class", func(s *corev1.PodSpec) { s.PriorityClassName = "high" }, "its pod's spec.priorityClassName differs from the warm pod's"},
		{"job container mount", func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = append(s.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "x", MountPath: "/x"})
		}, "its container job differs from the warm pod's in its volumeMounts"},
		{"a sidecar more", func(s *corev1.PodSpec) {
			s.InitContainers = append(s.InitContainers, corev1.Container{Name: "redis", Image: "redis:7"})
		}, "its pod has init container redis, which the warm pod lacks"},
		{"an image", func(s *corev1.PodSpec) { s.Containers[0].Image = "golang:1.27" }, "its container job would run image golang:1.27, the warm pod's runs "},
		{"only the env and deadline", func(s *corev1.PodSpec) {
			s.Containers[0].Env = nil
			s.ActiveDeadlineSeconds = ptr(int64(60))
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := cold.Spec.DeepCopy()
			tc.change(spec)
			got := specDifference(jobView(spec), jobView(&warm.Spec))
			if tc.want == "" {
				assert.Empty(t, got)
				return
			}
			assert.Contains(t, got, tc.want)
			hashCold, err := templateHash(spec)
			require.NoError(t, err)
			assert.NotEqual(t, warm.Annotations[AnnotationWarmTemplate], hashCold, "the hash sees the difference too")
		})
	}
}
