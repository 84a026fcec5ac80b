package podbuilder

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// TestHandoffEnvIsTheColdContainersEnv: what a warm pod's supervisor is handed is, variable
// for variable, what the kubelet would have given the job's own pod's job container.
func TestHandoffEnvIsTheColdContainersEnv(t *testing.T) {
	env, opts, job := warmEnv(), warmOpts(), baseJob()
	job.Spec.BuildEnvironment = "go"
	job.Spec.Env["DOLLARS"] = "kill -TERM $$ $(BUILDKITE_BRANCH)"
	job.Spec.EnvNames = []string{"SECRET_THING"}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: job.Spec.TokenSecretRef.Name}, Data: map[string][]byte{
		bkv1.DefaultSecretKey:             []byte("bkaj_token"),
		bkv1.EnvSecretKey("SECRET_THING"): []byte("s3cret $$ $(A)"),
	}}
	got, err := HandoffEnv(job, env, opts, sec)
	require.NoError(t, err)
	assert.Equal(t, "kill -TERM $$ $(BUILDKITE_BRANCH)", got["DOLLARS"], "the job's value byte for byte, as the kubelet gives it")
	assert.Equal(t, "s3cret $$ $(A)", got["SECRET_THING"], "a Secret's value is never expanded")
	assert.Equal(t, "bkaj_token", got[podcontract.EnvAccessToken])
	assert.Equal(t, "-mod=readonly", got["GOFLAGS"], "the environment's env")
	assert.Equal(t, job.Spec.JobID, got[podcontract.EnvJobID])

	cold, err := Build(job, env, opts)
	require.NoError(t, err)
	for _, v := range jobContainerOf(t, cold).Env {
		if v.ValueFrom != nil && v.ValueFrom.SecretKeyRef == nil {
			assert.NotContains(t, got, v.Name, "a value from the pod's own fields is the warm pod's")
			continue
		}
		assert.Contains(t, got, v.Name)
	}

	delete(sec.Data, bkv1.EnvSecretKey("SECRET_THING"))
	_, err = HandoffEnv(job, env, opts, sec)
	assert.ErrorContains(t, err, `variable SECRET_THING: the job's token Secret `+sec.Name+` has no key`)
}

func TestAssignWarm(t *testing.T) {
	env, opts, job := warmEnv(), warmOpts(), baseJob()
	job.Spec.BuildEnvironment = "go"
	job.UID = "b0b00000-0000-4000-8000-000000000001"
	warm, err := BuildWarm(env, opts, "go-warm-1")
	require.NoError(t, err)
	started := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	warm.Status.StartTime = &metav1.Time{Time: started}

	require.NoError(t, AssignWarm(warm, job, env, opts, started.Add(90*time.Second)))
	cold, err := Build(job, env, opts)
	require.NoError(t, err)
	for k, v := range cold.Labels {
		assert.Equal(t, v, warm.Labels[k], "label %s", k)
	}
	assert.NotEmpty(t, warm.Labels[LabelWarmPool], "the pool counts it as assigned")
	assert.Equal(t, cold.OwnerReferences, warm.OwnerReferences, "the BuildJob owns it, alone")
	assert.Empty(t, warm.Finalizers, "a job the operator accepted leaves no finalizer on its pod")
	require.NotNil(t, cold.Spec.ActiveDeadlineSeconds)
	assert.Equal(t, *cold.Spec.ActiveDeadlineSeconds+90, *warm.Spec.ActiveDeadlineSeconds, "the deadline counts from the pod's start")
}

func TestWarmStale(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(env *bkv1.BuildEnvironment, opts *Options, pod *corev1.Pod)
		want   string
	}{
		{name: "current"},
		{name: "as the cache keeps it", change: func(_ *bkv1.BuildEnvironment, _ *Options, p *corev1.Pod) {
			p.Spec.Volumes, p.Spec.Containers[0].Env = nil, nil
		}},
		{name: "the environment changed", change: func(e *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) { e.Generation++ },
			want: "BuildEnvironment go has changed since the pod was made (generation 3 then, 4 now)"},
		{name: "another endpoint", change: func(_ *bkv1.BuildEnvironment, o *Options, _ *corev1.Pod) { o.HandoffURL = "https://elsewhere/handoff" },
			want: "the operator's hand-off endpoint has changed"},
		{name: "another operator image", change: func(_ *bkv1.BuildEnvironment, o *Options, _ *corev1.Pod) { o.OperatorImage = "bk-operator/agentd:v2" },
			want: "the operator's settings (its images, say) have changed"},
		{name: "jobs start cold now", change: func(e *bkv1.BuildEnvironment, _ *Options, _ *corev1.Pod) {
			e.Spec.Env = append(e.Spec.Env, corev1.EnvVar{Name: "REF", Value: "$(BUILDKITE_BRANCH)"})
		}, want: "BuildEnvironment go's jobs all start cold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, opts := warmEnv(), warmOpts()
			pod, err := BuildWarm(env, opts, "go-warm-1")
			require.NoError(t, err)
			if tc.change != nil {
				tc.change(env, &opts, pod)
			}
			got := WarmStale(env, opts, pod)
			if tc.want == "" {
				assert.Empty(t, got)
				return
			}
			assert.Contains(t, got, tc.want)
		})
	}
}
