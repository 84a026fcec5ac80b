// Package api_test checks the generated CRDs on a real apiserver: valid objects are
// stored and read back, invalid ones are refused with a message that says what to fix,
// and kubectl shows the printer columns.
package api_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const ns = "default"

// validJob is a valid BuildJob whose token key is left for the API server to default.
func validJob(name string, mods ...gen.BuildJobModifier) *bkv1.BuildJob {
	return gen.BuildJobFrom(gen.BuildJob(name,
		gen.SetBuildJobNamespace(ns),
		gen.SetBuildJobBuildURL("https://buildkite.com/acme/my-app/builds/42"),
		gen.SetBuildJobStepKey("test"),
		gen.SetBuildJobStepLabel(":go: test"),
		gen.SetBuildJobAgentTags(map[string]string{"queue": "bk-operator", "cluster": "gke-prod"}),
		gen.SetBuildJobEnv(map[string]string{"BUILDKITE_BRANCH": "main"}),
		gen.SetBuildJobEnvironment("go-1-26"),
		gen.SetBuildJobLogPaths("/workspace/service.log"),
		gen.SetBuildJobTimeoutMinutes(30),
		gen.SetBuildJobTokenSecretRef(bkv1.SecretKeyRef{Name: name + "-token"}),
		gen.SetBuildJobAgentEndpoint("https://agent.buildkite.com/v3"),
	), mods...)
}

func validEnv(name string, mods ...gen.BuildEnvironmentModifier) *bkv1.BuildEnvironment {
	return gen.BuildEnvironmentFrom(gen.BuildEnvironment(name,
		gen.SetBuildEnvironmentNamespace(ns),
		gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")},
		}),
		gen.SetBuildEnvironmentSidecars(corev1.Container{Name: "postgres", Image: "postgres:17"}),
		gen.SetBuildEnvironmentTimeouts(30, 120),
		gen.SetBuildEnvironmentRetention(bkv1.Retention{FailedPods: &metav1.Duration{Duration: 600_000_000_000}}),
		gen.SetBuildEnvironmentAllowedPipelines("my-*"),
	), mods...)
}

func TestValidObjectsRoundTrip(t *testing.T) {
	ctx := context.Background()
	c := env.Client

	job := validJob("roundtrip")
	require.NoError(t, c.Create(ctx, job))
	var got bkv1.BuildJob
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(job), &got))
	assert.Equal(t, job.Spec.JobID, got.Spec.JobID)
	assert.Equal(t, "token", got.Spec.TokenSecretRef.Key, "the secret key defaults to token")
	assert.Equal(t, []string{"/workspace/service.log"}, got.Spec.LogPaths)

	got.Status.Phase = bkv1.PhaseRunning
	got.Status.PodName = "roundtrip-pod"
	got.Status.ExitStatus = ptr.To[int32](3)
	require.NoError(t, c.Status().Update(ctx, &got))

	be := validEnv("roundtrip")
	require.NoError(t, c.Create(ctx, be))
	var gotEnv bkv1.BuildEnvironment
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(be), &gotEnv))
	assert.Equal(t, bkv1.RunnerBootstrap, gotEnv.Spec.Runner, "runner defaults to Bootstrap")
	assert.Equal(t, "postgres", gotEnv.Spec.Sidecars[0].Name)
}

func TestCRDValidationRejects(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		obj  client.Object
		want string
	}{
		{"job id is not a uuid", validJob("bad-uuid", gen.SetBuildJobJobID("not-a-uuid")),
			`spec.jobID: Invalid value: "not-a-uuid": spec.jobID in body should match`},
		{"relative log path", validJob("bad-logpath", gen.SetBuildJobLogPaths("service.log")),
			"logPaths must be absolute paths, such as /workspace/service.log"},
		{"log path with ..", validJob("dotdot-logpath", gen.SetBuildJobLogPaths("/workspace/../etc/passwd")),
			"logPaths must not contain '..'"},
		{"token in env", validJob("token-env",
			gen.SetBuildJobEnv(map[string]string{"BUILDKITE_BRANCH": "main", "BUILDKITE_AGENT_ACCESS_TOKEN": "bkaj_secret"})),
			"tokens must not be put in env: reference the job token through tokenSecretRef"},
		{"build number zero", validJob("build-zero", gen.SetBuildJobBuildNumber(0)),
			"spec.buildNumber: Invalid value: 0: spec.buildNumber in body should be greater than or equal to 1"},
		{"env with both workspaces", validEnv("two-workspaces", gen.SetBuildEnvironmentWorkspace(bkv1.Workspace{
			EmptyDir:            &corev1.EmptyDirVolumeSource{},
			VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{},
		})),
			"workspace takes either emptyDir or volumeClaimTemplate, not both"},
		{"default timeout above maximum", validEnv("timeouts", gen.SetBuildEnvironmentTimeouts(90, 60)),
			"timeouts.defaultMinutes must not exceed timeouts.maxMinutes"},
		{"image with a space", validEnv("spaced-image", gen.SetBuildEnvironmentImage("golang 1.26")),
			"image must not contain spaces"},
		{"unknown runner", validEnv("bad-runner", gen.SetBuildEnvironmentRunner("Docker")),
			`spec.runner: Unsupported value: "Docker": supported values: "Command", "Bootstrap"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := env.Client.Create(ctx, tc.obj)
			require.Error(t, err, "the apiserver accepted an invalid object")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestBuildJobSpecIsImmutable(t *testing.T) {
	ctx := context.Background()
	job := validJob("immutable")
	require.NoError(t, env.Client.Create(ctx, job))
	job.Spec.Command = "rm -rf /"
	err := env.Client.Update(ctx, job)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec is immutable")
}

func TestKubectlColumns(t *testing.T) {
	ctx := context.Background()
	job := validJob("columns", gen.AddBuildJobLabels(map[string]string{bkv1.LabelPipeline: "my-app"}))
	require.NoError(t, env.Client.Create(ctx, job))
	job.Status.Phase = bkv1.PhaseFailed
	job.Status.ExitStatus = ptr.To[int32](3)
	job.Status.PodName = "columns-abcde"
	job.Status.SignalReason = "stack_error"
	require.NoError(t, env.Client.Status().Update(ctx, job))

	out, err := exec.Command(env.Kubectl(), "--kubeconfig", env.KubeconfigPath,
		"get", "buildjobs", "columns", "-n", ns, "-o", "wide").CombinedOutput()
	require.NoError(t, err, string(out))
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 2, string(out))
	assert.Equal(t, []string{"NAME", "PIPELINE", "BUILD", "STEP", "PHASE", "EXIT", "POD", "AGE", "ENVIRONMENT", "REASON", "URL"},
		strings.Fields(lines[0]))
	row := strings.Fields(lines[1])
	assert.Equal(t, []string{"columns", "my-app", "42", ":go:", "test", "Failed", "3", "columns-abcde"}, row[:8])
	assert.Equal(t, []string{"go-1-26", "stack_error", "https://buildkite.com/acme/my-app/builds/42"}, row[len(row)-3:])

	// The short name and the category find the same objects.
	for _, what := range []string{"bj", "buildkite"} {
		out, err = exec.Command(env.Kubectl(), "--kubeconfig", env.KubeconfigPath,
			"get", what, "-n", ns, "-l", bkv1.LabelPipeline+"=my-app", "-o", "name").CombinedOutput()
		require.NoError(t, err, string(out))
		assert.Equal(t, "buildjob.buildkite-operator.dev/columns", strings.TrimSpace(string(out)), what)
	}

	be := validEnv("columns")
	require.NoError(t, env.Client.Create(ctx, be))
	out, err = exec.Command(env.Kubectl(), "--kubeconfig", env.KubeconfigPath,
		"get", "benv", "columns", "-n", ns).CombinedOutput()
	require.NoError(t, err, string(out))
	lines = strings.Split(strings.TrimSpace(string(out)), "\n")
	assert.Equal(t, []string{"NAME", "IMAGE", "RUNNER", "READY", "AGE"}, strings.Fields(lines[0]))
	assert.Equal(t, []string{"columns", "golang:1.26", "Bootstrap"}, strings.Fields(lines[1])[:3])
}
