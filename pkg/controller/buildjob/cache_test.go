package buildjob

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// TestTrimTokenSecret: the cached token Secret keeps the token and what its events need
// (its owner: Setup's Owns enqueues the BuildJob from it), and nothing else of the Secret.
func TestTrimTokenSecret(t *testing.T) {
	yes := true
	owner := metav1.OwnerReference{APIVersion: bkv1.GroupVersion.String(), Kind: "BuildJob", Name: "j", UID: "u", Controller: &yes}
	in := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "j-token", Namespace: "ns", Labels: map[string]string{bkv1.LabelJob: "j"},
			OwnerReferences: []metav1.OwnerReference{owner},
			Annotations:     map[string]string{"a": "b"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "spawner"}},
		},
		Data: map[string][]byte{bkv1.DefaultSecretKey: []byte("bkaj_x"), "env-DB_PASSWORD": []byte("hunter2")},
	}
	out, err := trimTokenSecret(in)
	require.NoError(t, err)
	s := out.(*corev1.Secret)
	assert.Equal(t, map[string][]byte{bkv1.DefaultSecretKey: []byte("bkaj_x")}, s.Data, "the token only: the job's env stays out of the operator's memory")
	assert.Equal(t, []metav1.OwnerReference{owner}, s.OwnerReferences)
	assert.Equal(t, in.Labels, s.Labels)
	assert.Empty(t, s.Annotations)
	assert.Empty(t, s.ManagedFields)
}

// TestTrimPod: the cached pod keeps what the controller reads (status, node, each
// container's name, image, resources and restart policy, the grace period and deadline,
// the finalizers it patches away, the image volumes and their mounts) and drops what its
// containers are told.
func TestTrimPod(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	grace, deadline := int64(30), int64(600)
	container := func(name string, restart *corev1.ContainerRestartPolicy) corev1.Container {
		return corev1.Container{
			Name: name, Image: name + ":1", RestartPolicy: restart,
			Resources:    corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
			Env:          []corev1.EnvVar{{Name: "BUILDKITE_JOB_ID", Value: "j"}},
			EnvFrom:      []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "j-env"}}}},
			Command:      []string{"/agentd/agentd-supervise"},
			Args:         []string{"--finish-flushed"},
			VolumeMounts: []corev1.VolumeMount{{Name: "workspace", MountPath: "/workspace"}, {Name: "agent", MountPath: "/agent", SubPath: "bin"}},
		}
	}
	agent := corev1.Volume{Name: "agent", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "agent:1"}}}
	in := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "j", Namespace: "ns", Labels: map[string]string{bkv1.LabelJob: "j"},
			Finalizers:    []string{"buildkite-operator.dev/outcome"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "operator"}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-1", TerminationGracePeriodSeconds: &grace, ActiveDeadlineSeconds: &deadline,
			InitContainers: []corev1.Container{container("agentd-install", nil), container("sidecar", &always)},
			Containers:     []corev1.Container{container("job", nil)},
			Volumes:        []corev1.Volume{{Name: "workspace"}, agent},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Message: "m"},
	}
	want := in.DeepCopy()
	want.ManagedFields, want.Spec.Volumes = nil, []corev1.Volume{agent}
	for _, list := range [][]corev1.Container{want.Spec.InitContainers, want.Spec.Containers} {
		for i := range list {
			list[i].Env, list[i].EnvFrom, list[i].Command, list[i].Args = nil, nil, nil, nil
			list[i].VolumeMounts = []corev1.VolumeMount{{Name: "agent", MountPath: "/agent", SubPath: "bin"}}
		}
	}
	out, err := trimPod(in)
	require.NoError(t, err)
	assert.Equal(t, want, out)
}

// reportedBuildJob is a BuildJob as the spawner makes it and the controller leaves it once
// reported and let go of (no finalizer), with every part of the spec set.
func reportedBuildJob() *bkv1.BuildJob {
	timeout, exit := int32(30), int32(0)
	at := metav1.Now()
	return &bkv1.BuildJob{
		ObjectMeta: metav1.ObjectMeta{
			Name: "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f", Namespace: "jobs", UID: "uid-1", ResourceVersion: "7", Generation: 1,
			Labels:        map[string]string{bkv1.LabelPipeline: "my-app", bkv1.LabelJob: "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f"},
			Annotations:   map[string]string{bkv1.AnnotationAcceptedAt: "2026-01-02T03:04:05.123456789Z", bkv1.AnnotationIntake: "nonce"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "agentd"}},
		},
		Spec: bkv1.BuildJobSpec{
			JobID: "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f", OrganizationSlug: "acme", PipelineSlug: "my-app",
			BuildID: "0190f1b4-0000-4a6a-9d7e-3f2b1c0d9e8f", BuildNumber: 42, BuildURL: "https://buildkite.com/acme/my-app/builds/42",
			StepKey: "test", Label: ":go: test", Command: "make lint\nmake test",
			AgentTags:        map[string]string{"queue": "bk-operator"},
			Env:              map[string]string{"CI": "true"},
			EnvNames:         []string{"BUILDKITE_BRANCH", "BUILDKITE_COMMIT", "BUILDKITE_MESSAGE"},
			BuildEnvironment: "go",
			LogPaths:         []string{"/workspace/service.log"},
			TimeoutMinutes:   &timeout,
			Resources:        &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
			TokenSecretRef:   bkv1.SecretKeyRef{Name: "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f-token", Key: bkv1.DefaultSecretKey},
			AgentEndpoint:    "https://agent.buildkite.com/v3",
			LogLimits:        bkv1.LogLimits{ChunksMaxSizeBytes: 102400, ChunksIntervalSeconds: 1},
		},
		Status: bkv1.BuildJobStatus{
			Phase: bkv1.PhaseSucceeded, ExitStatus: &exit, PodName: "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f",
			Times: bkv1.BuildJobTimes{AcceptedAt: &at, PodCreatedAt: &at, StartedAt: &at, FinishedAt: &at, ReportedAt: &at},
			Log:   bkv1.LogProgress{Bytes: 12, Chunks: 1},
			Conditions: []metav1.Condition{
				{Type: bkv1.ConditionPodCreated, Status: metav1.ConditionTrue, Reason: bkv1.ReasonPodCreated},
				{Type: bkv1.ConditionFinished, Status: metav1.ConditionTrue, Reason: bkv1.ReasonExited, Message: "The job's command exited with status 0"},
				{Type: bkv1.ConditionReported, Status: metav1.ConditionTrue, Reason: bkv1.ReasonReported},
			},
		},
	}
}

// TestTrimBuildJob: a BuildJob still running or being reported is cached whole (but its
// managedFields); one reported and let go of loses what only running it needs, keeps
// what its remaining readers read (see trimBuildJob), and is marked as trimmed.
func TestTrimBuildJob(t *testing.T) {
	// whole is the BuildJob as the cache must keep it when it must not be trimmed.
	whole := func(bj *bkv1.BuildJob) *bkv1.BuildJob {
		out := bj.DeepCopy()
		out.ManagedFields = nil
		return out
	}
	trimmed := func(bj *bkv1.BuildJob) *bkv1.BuildJob {
		out := whole(bj)
		s := &out.Spec
		s.Command, s.AgentTags, s.Env, s.EnvNames, s.LogPaths, s.TimeoutMinutes, s.Resources, s.AgentEndpoint = "", nil, nil, nil, nil, nil, nil, ""
		out.Labels, out.Annotations = nil, map[string]string{AnnotationCacheTrimmed: trimMark}
		return out
	}
	cases := []struct {
		name        string
		in          func(*bkv1.BuildJob)
		want        func(*bkv1.BuildJob) *bkv1.BuildJob
		wantTrimmed bool
	}{
		{name: "running", in: func(bj *bkv1.BuildJob) {
			bj.Status = bkv1.BuildJobStatus{Phase: bkv1.PhaseRunning}
			bj.Finalizers = []string{Finalizer}
		}, want: whole},
		{name: "finished, being reported", in: func(bj *bkv1.BuildJob) {
			bj.Status.Times.ReportedAt = nil
			bj.Finalizers = []string{Finalizer}
		}, want: whole},
		{name: "reported, finalizer still on (reap removes it with an Update)", in: func(bj *bkv1.BuildJob) {
			bj.Finalizers = []string{Finalizer}
		}, want: whole},
		{name: "reported and let go of", want: trimmed, wantTrimmed: true},
		{name: "reported, being deleted", in: func(bj *bkv1.BuildJob) {
			now := metav1.Now()
			bj.DeletionTimestamp, bj.Finalizers = &now, []string{"someone-else/finalizer"}
		}, want: trimmed, wantTrimmed: true},
		{name: "reported, applied with kubectl", in: func(bj *bkv1.BuildJob) {
			bj.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = `{"spec":{"command":"make lint\nmake test"}}`
		}, want: trimmed, wantTrimmed: true},
		{name: "reported, nothing to drop: the real object, unmarked", in: func(bj *bkv1.BuildJob) {
			s := &bj.Spec
			s.Command, s.AgentTags, s.Env, s.EnvNames, s.LogPaths, s.TimeoutMinutes, s.Resources, s.AgentEndpoint = "", nil, nil, nil, nil, nil, nil, ""
		}, want: whole},
		{name: "running, with the mark written by someone: not taken for a trimmed copy", in: func(bj *bkv1.BuildJob) {
			bj.Status = bkv1.BuildJobStatus{Phase: bkv1.PhaseRunning}
			bj.Finalizers = []string{Finalizer}
			bj.Annotations[AnnotationCacheTrimmed] = "trimmed-by-cache-0123"
		}, want: whole},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := reportedBuildJob()
			if tc.in != nil {
				tc.in(in)
			}
			want := tc.want(in)
			out, err := trimBuildJob(in.DeepCopy())
			require.NoError(t, err)
			got := out.(*bkv1.BuildJob)
			assert.Equal(t, want, got)
			assert.Equal(t, tc.wantTrimmed, TrimmedInCache(got))

			// Idempotent: an object the cache already holds may be passed again.
			again, err := trimBuildJob(got.DeepCopy())
			require.NoError(t, err)
			assert.Equal(t, got, again)

			// What the readers of a reported BuildJob read is there (trimBuildJob).
			assert.Equal(t, reported(in), reported(got))
			assert.Equal(t, in.Status, got.Status)
			assert.Equal(t, in.Finalizers, got.Finalizers)
			assert.Equal(t, in.DeletionTimestamp, got.DeletionTimestamp)
			for _, f := range []func(*bkv1.BuildJob) any{
				func(bj *bkv1.BuildJob) any { return bj.UID },
				func(bj *bkv1.BuildJob) any { return bj.ResourceVersion },
				func(bj *bkv1.BuildJob) any { return bj.Generation },
				func(bj *bkv1.BuildJob) any { return bj.Spec.BuildEnvironment },
				func(bj *bkv1.BuildJob) any { return bj.Spec.TokenSecretRef },
				func(bj *bkv1.BuildJob) any { return bj.Spec.JobID },
				func(bj *bkv1.BuildJob) any { return bj.Spec.Label },
			} {
				assert.Equal(t, f(in), f(got))
			}
		})
	}
}

// TestConfigureCacheTrimsBuildJobs: the manager's cache gets the BuildJob transform, and
// it strips managedFields itself (a type's transform replaces the default one).
func TestConfigureCacheTrimsBuildJobs(t *testing.T) {
	var opts cache.Options
	ConfigureCache(&opts)
	var transform toolscache.TransformFunc
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*bkv1.BuildJob); ok {
			transform = by.Transform
		}
	}
	require.NotNil(t, transform, "no transform for BuildJobs")
	out, err := transform(reportedBuildJob())
	require.NoError(t, err)
	got := out.(*bkv1.BuildJob)
	assert.True(t, TrimmedInCache(got))
	assert.Empty(t, got.ManagedFields)
}
