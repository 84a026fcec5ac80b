package validation_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// namespaceEnvs are the environments of a namespace: some for every pipeline, one for
// payments pipelines only, and one that is broken and cannot run anything.
func namespaceEnvs() []bkv1.BuildEnvironment {
	envs := []*bkv1.BuildEnvironment{
		gen.BuildEnvironment("default"),
		gen.BuildEnvironment("go-1-26", gen.SetBuildEnvironmentAllowedPipelines("my-*", "tools")),
		gen.BuildEnvironment("large", gen.SetBuildEnvironmentAllowedPipelines("*")),
		gen.BuildEnvironment("payments-go", gen.SetBuildEnvironmentAllowedPipelines("payments-*")),
		gen.BuildEnvironment("broken", gen.SetBuildEnvironmentImage("")),
	}
	out := make([]bkv1.BuildEnvironment, len(envs))
	for i, e := range envs {
		out[i] = *e
	}
	return out
}

func TestEnvironmentProblem(t *testing.T) {
	all := namespaceEnvs()
	byName := map[string]*bkv1.BuildEnvironment{}
	for i := range all {
		byName[all[i].Name] = &all[i]
	}
	var many []bkv1.BuildEnvironment
	for i := range 14 {
		many = append(many, *gen.BuildEnvironment(fmt.Sprintf("env-%02d", i)))
	}
	for _, tc := range []struct {
		name, pipeline, asked string
		available             []bkv1.BuildEnvironment
		want                  string
	}{
		{
			name: "usable", pipeline: "my-app", asked: "go-1-26", available: all,
		},
		{
			name: "missing, one letter off", pipeline: "my-app", asked: "go-1-25", available: all,
			want: `BuildEnvironment "go-1-25" does not exist. Did you mean "go-1-26"? Pipeline "my-app" may use "default", "go-1-26", "large"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).`,
		},
		{
			name: "missing, case differs", pipeline: "my-app", asked: "Large", available: all,
			want: `BuildEnvironment "Large" does not exist. Did you mean "large"? Pipeline "my-app" may use "default", "go-1-26", "large"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).`,
		},
		{
			name: "missing, nothing near", pipeline: "my-app", asked: "rust", available: all,
			want: `BuildEnvironment "rust" does not exist. Pipeline "my-app" may use "default", "go-1-26", "large"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).`,
		},
		{
			// The nearest name overall is payments-go, which this pipeline may not use.
			name: "missing, the nearest name is not for this pipeline", pipeline: "my-app", asked: "payments-g", available: all,
			want: `BuildEnvironment "payments-g" does not exist. Pipeline "my-app" may use "default", "go-1-26", "large"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).`,
		},
		{
			name: "forbidden", pipeline: "payments-api", asked: "go-1-26", available: all,
			want: `The pipeline "payments-api" may not use BuildEnvironment "go-1-26", which is for pipelines matching "my-*", "tools". Pipeline "payments-api" may use "default", "large", "payments-go"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env), or ask a cluster operator to allow pipeline "payments-api" in BuildEnvironment "go-1-26".`,
		},
		{
			name: "no environment named", pipeline: "my-app", asked: "", available: all,
			want: `The step names no BuildEnvironment and the operator has no default one: name the BuildEnvironment the job runs in with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env). Pipeline "my-app" may use "default", "go-1-26", "large".`,
		},
		{
			name: "no environment for this pipeline at all", pipeline: "my-app", asked: "go", available: []bkv1.BuildEnvironment{*byName["payments-go"], *byName["broken"]},
			want: `BuildEnvironment "go" does not exist. No BuildEnvironment that can run jobs allows pipeline "my-app"; ask a cluster operator for one.`,
		},
		{
			name: "a long list is cut", pipeline: "my-app", asked: "env-1", available: many,
			want: `BuildEnvironment "env-1" does not exist. Did you mean "env-01"? Pipeline "my-app" may use "env-00", "env-01", "env-02", "env-03", "env-04", "env-05", "env-06", "env-07", "env-08", "env-09" and 4 more; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := byName[tc.asked]
			for i := range tc.available {
				if tc.available[i].Name == tc.asked {
					env = &tc.available[i]
				}
			}
			got := validation.EnvironmentProblem(tc.pipeline, tc.asked, env, tc.available)
			assert.Equal(t, tc.want, got)
			// Written for pipeline authors: no field paths, no kubectl.
			assert.NotContains(t, got, "spec.")
			assert.NotContains(t, got, "kubectl")
		})
	}
}

func TestEditDistanceSuggestion(t *testing.T) {
	names := []string{"go-1-26", "node-22", "python-3-13", "large"}
	for _, tc := range []struct{ asked, want string }{
		{"go-1-25", "go-1-26"},
		{"go1-26", "go-1-26"},
		{"node-20", "node-22"},
		{"python-3.13", "python-3-13"},
		{"larg", "large"},
		{"LARGE", "large"},
		{"rust", ""},
		{"go", ""},
	} {
		assert.Equal(t, tc.want, validation.Nearest(tc.asked, names), "nearest to %q", tc.asked)
	}
}

func TestForPipelineAuthors(t *testing.T) {
	errs := field.ErrorList{
		field.Invalid(field.NewPath("spec", "buildEnvironment"), "go-1-25", `BuildEnvironment "go-1-25" does not exist.`),
		field.Required(field.NewPath("spec", "command"), "give the step a command"),
	}
	got := validation.ForPipelineAuthors(errs)
	assert.Equal(t, []string{`BuildEnvironment "go-1-25" does not exist.`, "give the step a command"}, got)
	for _, line := range got {
		assert.False(t, strings.HasPrefix(line, "spec."), "a field path in %q", line)
	}
}

// The messages for a job whose environment is missing or forbidden are the same in
// BuildJob (the webhook, the spawner) as EnvironmentProblem's.
func TestBuildJobEnvironmentMessages(t *testing.T) {
	all := namespaceEnvs()
	for _, tc := range []struct {
		name, pipeline, asked string
		wantField             string
	}{
		{"missing", "my-app", "go-1-25", `spec.buildEnvironment: Invalid value: "go-1-25": `},
		{"forbidden", "payments-api", "go-1-26", `spec.pipelineSlug: Forbidden: `},
		{"none named", "my-app", "", `spec.buildEnvironment: Required value: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := testJob(gen.SetBuildJobPipeline(tc.pipeline), gen.SetBuildJobEnvironment(tc.asked))
			var env *bkv1.BuildEnvironment
			for i := range all {
				if all[i].Name == tc.asked {
					env = &all[i]
				}
			}
			errs, _ := validation.BuildJob(job, env, nil, all)
			if assert.Len(t, errs, 1) {
				assert.Equal(t, tc.wantField+validation.EnvironmentProblem(tc.pipeline, tc.asked, env, all), errs[0].Error())
			}
		})
	}
}

// A job whose environment breaks the rules is refused at intake, saying so without the
// environment's field paths: the cluster operator finds those in its Ready condition.
func TestBuildJobInBrokenEnvironment(t *testing.T) {
	env := testEnv(func(e *bkv1.BuildEnvironment) {
		e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptrTo(true)}
		e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres::17"}}
	})
	errs, _ := validation.BuildJob(testJob(), env, nil, nil)
	assert.Equal(t, []string{
		`spec.buildEnvironment: Invalid value: "go": BuildEnvironment "go" cannot run jobs until a cluster operator fixes it (2 problems, listed in its Ready condition).`,
	}, messages(errs))
}

func ptrTo[T any](v T) *T { return &v }
