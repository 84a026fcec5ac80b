package validation_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

const admissionNS = "jobs"

// reads counts what a reader was asked, by kind ("BuildEnvironment", "LimitRangeList", ...).
type reads struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *reads) count(obj runtime.Object) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	switch obj.(type) {
	case *bkv1.BuildEnvironment:
		r.n["BuildEnvironment"]++
	case *bkv1.BuildEnvironmentList:
		r.n["BuildEnvironmentList"]++
	case *corev1.LimitRangeList:
		r.n["LimitRangeList"]++
	default:
		r.n["other"]++
	}
}

func (r *reads) of(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[kind]
}

// countingReader is a fake API server holding objs that counts the reads it answers, and
// fails them all with fail when that is set.
func countingReader(t *testing.T, fail error, objs ...client.Object) (client.Reader, *reads) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(scheme))
	require.NoError(t, bkv1.AddToScheme(scheme))
	r := &reads{}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			r.count(obj)
			if fail != nil {
				return fail
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			r.count(list)
			if fail != nil {
				return fail
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	return c, r
}

// admissionEnvs: "go" has a default and a maximum timeout; "payments" allows payments
// pipelines only; "fallback" is the operator's default environment.
func admissionEnvs() []client.Object {
	return []client.Object{
		gen.BuildEnvironment("go", gen.SetBuildEnvironmentNamespace(admissionNS), gen.SetBuildEnvironmentTimeouts(30, 60)),
		gen.BuildEnvironment("payments", gen.SetBuildEnvironmentNamespace(admissionNS), gen.SetBuildEnvironmentAllowedPipelines("payments-*")),
		gen.BuildEnvironment("fallback", gen.SetBuildEnvironmentNamespace(admissionNS), gen.SetBuildEnvironmentTimeouts(10, 20)),
		&corev1.LimitRange{
			ObjectMeta: metav1.ObjectMeta{Name: "max", Namespace: admissionNS},
			Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
				Type: corev1.LimitTypeContainer,
				Max:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")},
			}}},
		},
	}
}

// admissionJobs are BuildJobs as the spawner makes them, before any defaulting.
var admissionJobs = []struct {
	name string
	mods []gen.BuildJobModifier
	// wantEnv is the environment the job runs in once defaulted; wantProblems how many
	// problems Admit finds.
	wantEnv      string
	wantProblems int
}{
	{"its own environment, valid", []gen.BuildJobModifier{gen.SetBuildJobEnvironment("go")}, "go", 0},
	{"no environment: the default one", nil, "fallback", 0},
	{"an environment that does not exist", []gen.BuildJobModifier{gen.SetBuildJobEnvironment("nope")}, "nope", 1},
	{"an environment the pipeline may not use", []gen.BuildJobModifier{gen.SetBuildJobEnvironment("payments")}, "payments", 1},
	{"a step timeout over the maximum", []gen.BuildJobModifier{gen.SetBuildJobEnvironment("go"),
		gen.SetBuildJobEnv(map[string]string{validation.EnvTimeout: "90"})}, "go", 1},
	{"more CPU than the namespace's LimitRange allows", []gen.BuildJobModifier{gen.SetBuildJobEnvironment("go"),
		gen.SetBuildJobResources(corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}})}, "go", 1},
}

func admissionJob(mods []gen.BuildJobModifier) *bkv1.BuildJob {
	return gen.BuildJob("0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f", append([]gen.BuildJobModifier{gen.SetBuildJobNamespace(admissionNS)}, mods...)...)
}

// Admit is the admission chain in one call: what the mutating webhook (Default) and then
// the validating one (Check) make of a job, Admit makes of it, reading its environment
// once. Should the spawner's call and the webhooks' steps drift apart, this fails.
func TestAdmitIsDefaultThenCheck(t *testing.T) {
	for _, tc := range admissionJobs {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			chainReader, _ := countingReader(t, nil, admissionEnvs()...)
			chain := validation.Admission{Reader: chainReader, DefaultEnvironment: "fallback"}
			viaChain := admissionJob(tc.mods)
			require.NoError(t, chain.Default(ctx, viaChain))
			want, err := chain.Check(ctx, viaChain)
			require.NoError(t, err)

			reader, counted := countingReader(t, nil, admissionEnvs()...)
			admitted := admissionJob(tc.mods)
			got, err := validation.Admission{Reader: reader, DefaultEnvironment: "fallback"}.Admit(ctx, admitted)
			require.NoError(t, err)

			assert.Equal(t, viaChain, admitted, "Admit defaults the job as the mutating webhook does")
			assert.Equal(t, want, got, "Admit finds what the validating webhook finds")
			assert.Equal(t, tc.wantEnv, admitted.Spec.BuildEnvironment)
			assert.Len(t, got.Problems, tc.wantProblems, "problems: %v", got.Problems)
			assert.Equal(t, 1, counted.of("BuildEnvironment"), "the job's environment is read once")
			assert.Equal(t, 1, counted.of("LimitRangeList"))
			if got.Environment != nil {
				assert.Equal(t, tc.wantEnv, got.Environment.Name)
			}
		})
	}
}

// Check checks the BuildJob as it is: a job the mutating webhook did not default is not
// given the default environment behind its back, and Default alone checks nothing.
func TestCheckDoesNotDefault(t *testing.T) {
	ctx := context.Background()
	reader, _ := countingReader(t, nil, admissionEnvs()...)
	a := validation.Admission{Reader: reader, DefaultEnvironment: "fallback"}

	job := admissionJob(nil)
	v, err := a.Check(ctx, job)
	require.NoError(t, err)
	require.Len(t, v.Problems, 1)
	assert.Equal(t, "spec.buildEnvironment", v.Problems[0].Field)
	assert.Nil(t, v.Environment)
	assert.Empty(t, job.Spec.BuildEnvironment, "Check changed the job")

	tooLong := admissionJob([]gen.BuildJobModifier{gen.SetBuildJobEnvironment("go"), gen.SetBuildJobTimeoutMinutes(600)})
	require.NoError(t, a.Default(ctx, tooLong), "Default refuses nothing")
	assert.Equal(t, int32(600), *tooLong.Spec.TimeoutMinutes, "a timeout the job gives is kept")
}

// A lookup that fails is an error, for the caller to retry, never a problem of the job's.
func TestAdmissionLookupFails(t *testing.T) {
	down := errors.New("connection refused")
	reader, _ := countingReader(t, down, admissionEnvs()...)
	a := validation.Admission{Reader: reader, DefaultEnvironment: "fallback"}
	ctx := context.Background()

	_, err := a.Admit(ctx, admissionJob(nil))
	require.ErrorIs(t, err, down)
	assert.Contains(t, err.Error(), "BuildEnvironment jobs/fallback")
	_, err = a.Check(ctx, admissionJob([]gen.BuildJobModifier{gen.SetBuildJobEnvironment("go")}))
	require.ErrorIs(t, err, down)
	require.ErrorIs(t, a.Default(ctx, admissionJob(nil)), down)
}
