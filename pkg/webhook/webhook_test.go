package webhook_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation/validationtest"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

const (
	ns        = "default"
	limitedNS = "limited"
)

// Messages the API server wraps around our webhooks' denials.
func jobDenied(name, detail string) string {
	return fmt.Sprintf(`admission webhook "vbuildjob.buildkite-operator.dev" denied the request: BuildJob.buildkite-operator.dev %q is invalid: %s`, name, detail)
}

func envDenied(name, detail string) string {
	return fmt.Sprintf(`admission webhook "vbuildenvironment.buildkite-operator.dev" denied the request: BuildEnvironment.buildkite-operator.dev %q is invalid: %s`, name, detail)
}

var jobSerial int

// job returns a valid BuildJob for environment "go" with a unique name and job ID.
func job(mods ...gen.BuildJobModifier) *bkv1.BuildJob {
	jobSerial++
	return gen.BuildJobFrom(gen.BuildJob(fmt.Sprintf("job-%d", jobSerial),
		gen.SetBuildJobNamespace(ns),
		gen.SetBuildJobJobID(fmt.Sprintf("0190f1b4-8c1e-4a6a-9d7e-%012d", jobSerial)),
		gen.SetBuildJobStepKey("test"),
		gen.SetBuildJobEnvironment("go"),
	), mods...)
}

// environment returns a valid BuildEnvironment that draws no warnings.
func environment(name string, mods ...gen.BuildEnvironmentModifier) *bkv1.BuildEnvironment {
	return gen.BuildEnvironmentFrom(gen.BuildEnvironment(name,
		gen.SetBuildEnvironmentNamespace(ns),
		gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")},
		}),
		gen.SetBuildEnvironmentMaxResources(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}),
		gen.SetBuildEnvironmentTimeouts(30, 120),
		gen.SetBuildEnvironmentAllowedPipelines("my-*"),
	), mods...)
}

var setupOnce = map[string]bool{}

// fixtures creates the environments and the LimitRange the BuildJob tests use.
func fixtures(t *testing.T) {
	t.Helper()
	if setupOnce["done"] {
		return
	}
	ctx := context.Background()
	c := env.Client
	require.NoError(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: limitedNS}}))
	for _, e := range []*bkv1.BuildEnvironment{
		environment("go", gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
		environment(defaultEnvironment, gen.SetBuildEnvironmentAllowedPipelines("*")),
		environment("boot", gen.SetBuildEnvironmentRunner(bkv1.RunnerBootstrap), gen.SetBuildEnvironmentImage("buildkite/agent:3.52.0")),
		environment("untimed", func(e *bkv1.BuildEnvironment) { e.Spec.Timeouts = bkv1.Timeouts{} }),
		environment("small", func(e *bkv1.BuildEnvironment) {
			e.Namespace = limitedNS
			e.Spec.Resources = corev1.ResourceRequirements{}
			e.Spec.MaxResources = nil
			// Legal, but draws a warning: the test below reads it back.
		}),
		environment("payments", gen.SetBuildEnvironmentNamespace(limitedNS), gen.SetBuildEnvironmentAllowedPipelines("payments-*"),
			func(e *bkv1.BuildEnvironment) {
				e.Spec.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("2Gi")
			}),
	} {
		require.NoError(t, c.Create(ctx, e), "creating BuildEnvironment %s", e.Name)
	}
	require.NoError(t, c.Create(ctx, &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "max", Namespace: limitedNS},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type: corev1.LimitTypeContainer,
			Max:  corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
		}}},
	}))
	setupOnce["done"] = true
}

func TestBuildJobRejected(t *testing.T) {
	fixtures(t)
	ctx := context.Background()
	for _, tc := range []struct {
		rule   string
		mutate gen.BuildJobModifier
		// want is the field error our webhook reports; wantRaw, when set, is the whole
		// message (for rules the CRD schema enforces before any webhook runs).
		want, wantRaw string
	}{
		{
			// In the namespace whose environments no other test changes, so that the list
			// of those the pipeline may use is known.
			rule:   "environment does not exist",
			mutate: func(j *bkv1.BuildJob) { j.Namespace, j.Spec.BuildEnvironment = limitedNS, "smal" },
			want:   `spec.buildEnvironment: Invalid value: "smal": BuildEnvironment "smal" does not exist. Did you mean "small"? Pipeline "my-app" may use "small"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env).`,
		},
		{
			rule:   "pipeline may not use the environment",
			mutate: func(j *bkv1.BuildJob) { j.Namespace, j.Spec.BuildEnvironment = limitedNS, "payments" },
			want:   `spec.pipelineSlug: Forbidden: The pipeline "my-app" may not use BuildEnvironment "payments", which is for pipelines matching "payments-*". Pipeline "my-app" may use "small"; choose one with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env), or ask a cluster operator to allow pipeline "my-app" in BuildEnvironment "payments".`,
		},
		{
			rule:   "resources above the environment's maximum",
			mutate: gen.SetBuildJobResources(corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8")}}),
			want:   `spec.resources.limits[cpu]: Invalid value: "8": exceeds the maximum of 4 that BuildEnvironment "go" allows (spec.maxResources); ask for less`,
		},
		{
			rule: "resources above the namespace's LimitRange",
			mutate: func(j *bkv1.BuildJob) {
				j.Namespace = limitedNS
				j.Spec.BuildEnvironment = "small"
				j.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("3Gi")}}
			},
			want: `spec.resources.limits[memory]: Invalid value: "3Gi": exceeds the maximum of 2Gi per container set by LimitRange "max" in namespace "limited"; ask for at most 2Gi`,
		},
		{
			rule: "requests above limits",
			mutate: gen.SetBuildJobResources(corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			}),
			want: `spec.resources.requests[cpu]: Invalid value: "3": must be less than or equal to the cpu limit of 2; lower the request or raise the limit`,
		},
		{
			rule:   "request above the environment's limit",
			mutate: gen.SetBuildJobResources(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("6Gi")}}),
			want:   `spec.resources.requests[memory]: Invalid value: "6Gi": must be less than or equal to the memory limit of 4Gi (this value comes from BuildEnvironment "go" spec.resources.limits); lower the request or raise the limit`,
		},
		{
			rule:   "no command",
			mutate: gen.SetBuildJobCommand(""),
			want:   `spec.command: Required value: BuildEnvironment "go" runs the step's command itself (runner Command), so the step needs a command; give the step a command, or use an environment with runner Bootstrap if a plugin provides it`,
		},
		{
			// As the spawner makes BuildJobs: the env's values in the token Secret; a listed
			// BUILDKITE_PLUGINS holds plugins other than the operator's.
			rule:   "plugins, Command runner",
			mutate: func(j *bkv1.BuildJob) { j.Spec.EnvNames = []string{"BUILDKITE_PLUGINS"} },
			want:   `spec.env[BUILDKITE_PLUGINS]: Forbidden: BuildEnvironment "go" runs only the step's command (runner Command), without the step's plugins; choose an environment whose runner is Bootstrap (the default) with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env), or ask a cluster operator for one`,
		},
		{
			rule: "no command and no plugin, Bootstrap runner",
			mutate: func(j *bkv1.BuildJob) {
				j.Spec.Command = ""
				j.Spec.BuildEnvironment = "boot"
			},
			want: `spec.command: Required value: the step has no command and no plugin that could provide one; give the step a command`,
		},
		{
			rule:   "timeout above the environment's maximum",
			mutate: gen.SetBuildJobTimeoutMinutes(300),
			want:   `spec.timeoutMinutes: Invalid value: 300: exceeds the maximum of 120 minutes that BuildEnvironment "go" allows (spec.timeouts.maxMinutes); set the step's timeout_in_minutes to at most 120`,
		},
		{
			rule:   "step timeout (BUILDKITE_TIMEOUT, defaulted) above the environment's maximum",
			mutate: gen.SetBuildJobEnv(map[string]string{"BUILDKITE_TIMEOUT": "500"}),
			want:   `spec.timeoutMinutes: Invalid value: 500: exceeds the maximum of 120 minutes that BuildEnvironment "go" allows (spec.timeouts.maxMinutes); set the step's timeout_in_minutes to at most 120`,
		},
		{
			rule:   "malformed BUILDKITE_TIMEOUT",
			mutate: gen.SetBuildJobEnv(map[string]string{"BUILDKITE_TIMEOUT": "soon"}),
			want:   `spec.env[BUILDKITE_TIMEOUT]: Invalid value: "soon": must be a whole number of minutes greater than 0, or "false" for no timeout`,
		},
		{
			rule:    "log path not absolute (the CRD's rule, same words as pkg/validation)",
			mutate:  gen.SetBuildJobLogPaths("service.log"),
			wantRaw: `BuildJob.buildkite-operator.dev "%s" is invalid: spec.logPaths: Invalid value: logPaths must be absolute paths, such as /workspace/service.log`,
		},
		{
			rule:    "log path with .. (the CRD's rule, same words as pkg/validation)",
			mutate:  gen.SetBuildJobLogPaths("/workspace/../etc/passwd"),
			wantRaw: `BuildJob.buildkite-operator.dev "%s" is invalid: spec.logPaths: Invalid value: logPaths must not contain '..': name the file by its absolute path`,
		},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c, _ := newClient(t)
			j := job(tc.mutate)
			err := c.Create(ctx, j)
			require.Error(t, err, "the API server accepted an invalid BuildJob")
			if tc.wantRaw != "" {
				assert.EqualError(t, err, fmt.Sprintf(tc.wantRaw, j.Name))
			} else {
				assert.EqualError(t, err, jobDenied(j.Name, tc.want))
			}
			assert.True(t, apierrors.IsInvalid(err) || apierrors.IsForbidden(err), "reason: %v", apierrors.ReasonForError(err))
		})
	}
}

func TestBuildJobDefaultsAndValid(t *testing.T) {
	fixtures(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		mutate       gen.BuildJobModifier
		wantEnv      string
		wantTimeout  *int32
		wantLabels   map[string]string
		wantWarnings []string
	}{
		{
			name: "default environment and the step's timeout",
			mutate: func(j *bkv1.BuildJob) {
				j.Spec.BuildEnvironment = ""
				j.Spec.Env = map[string]string{"BUILDKITE_TIMEOUT": "45"}
			},
			wantEnv:     defaultEnvironment,
			wantTimeout: ptr.To[int32](45),
			wantLabels:  map[string]string{bkv1.LabelEnvironment: defaultEnvironment},
		},
		{
			name:        "no step timeout: the environment's default",
			mutate:      gen.SetBuildJobEnv(map[string]string{"BUILDKITE_TIMEOUT": "false"}),
			wantEnv:     "go",
			wantTimeout: ptr.To[int32](30),
			wantLabels:  map[string]string{bkv1.LabelEnvironment: "go"},
		},
		{
			name: "the spec's own timeout wins",
			mutate: func(j *bkv1.BuildJob) {
				j.Spec.TimeoutMinutes = ptr.To[int32](90)
				j.Spec.Env = map[string]string{"BUILDKITE_TIMEOUT": "45"}
			},
			wantEnv:     "go",
			wantTimeout: ptr.To[int32](90),
		},
		{
			name: "step key made a label value; a wrong label is corrected",
			mutate: func(j *bkv1.BuildJob) {
				j.Spec.StepKey = ":go: unit tests"
				j.Labels = map[string]string{bkv1.LabelPipeline: "someone-else"}
			},
			wantEnv:     "go",
			wantTimeout: ptr.To[int32](30),
			wantLabels:  map[string]string{bkv1.LabelStep: "go--unit-tests", bkv1.LabelPipeline: "my-app"},
		},
		{
			name: "a plugin may provide the command under Bootstrap",
			mutate: func(j *bkv1.BuildJob) {
				j.Spec.Command = ""
				j.Spec.BuildEnvironment = "boot"
				j.Spec.Env = map[string]string{"BUILDKITE_PLUGINS": `[{"github.com/buildkite-plugins/docker-compose-buildkite-plugin#v5.0.0":{"run":"app"}}]`}
			},
			wantEnv:     "boot",
			wantTimeout: ptr.To[int32](30),
		},
		{
			name:         "no timeout anywhere: allowed, with a warning",
			mutate:       gen.SetBuildJobEnvironment("untimed"),
			wantEnv:      "untimed",
			wantWarnings: []string{`spec.timeoutMinutes: not set, and BuildEnvironment "untimed" has no spec.timeouts.defaultMinutes, so the job runs until it ends or is canceled in Buildkite; give the step a timeout_in_minutes`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, w := newClient(t)
			j := job(tc.mutate)
			require.NoError(t, c.Create(ctx, j))
			assert.Equal(t, tc.wantWarnings, w.take())

			var got bkv1.BuildJob
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(j), &got))
			assert.Equal(t, tc.wantEnv, got.Spec.BuildEnvironment)
			assert.Equal(t, tc.wantTimeout, got.Spec.TimeoutMinutes)
			want := map[string]string{
				bkv1.LabelPipeline:    "my-app",
				bkv1.LabelBuild:       "42",
				bkv1.LabelStep:        "test",
				bkv1.LabelJob:         j.Spec.JobID,
				bkv1.LabelEnvironment: tc.wantEnv,
			}
			for k, v := range tc.wantLabels {
				want[k] = v
			}
			assert.Equal(t, want, got.Labels)
		})
	}
}

// A BuildJob's later updates (the controller's finalizers and labels) are not
// re-validated: its environment may be gone by then.
func TestBuildJobUpdateNotRevalidated(t *testing.T) {
	fixtures(t)
	ctx := context.Background()
	c, _ := newClient(t)
	e := environment("short-lived", gen.SetBuildEnvironmentAllowedPipelines("*"))
	require.NoError(t, c.Create(ctx, e))
	j := job(gen.SetBuildJobEnvironment("short-lived"))
	require.NoError(t, c.Create(ctx, j))
	require.NoError(t, c.Delete(ctx, e))

	j.Finalizers = []string{"buildkite-operator.dev/test"}
	require.NoError(t, c.Update(ctx, j), "a metadata update must pass though the environment is gone")
	j.Finalizers = nil
	require.NoError(t, c.Update(ctx, j))
}

func TestBuildEnvironmentRejected(t *testing.T) {
	ctx := context.Background()
	cache := corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	for _, tc := range []struct {
		rule   string
		mutate gen.BuildEnvironmentModifier
		want   string
	}{
		{
			rule:   "container without an image",
			mutate: gen.SetBuildEnvironmentSidecars(corev1.Container{Name: "db"}),
			want:   `spec.sidecars[0].image: Required value: give an image, such as golang:1.26 or registry.example.com/ci/go@sha256:...`,
		},
		{
			rule:   "invalid image reference",
			mutate: gen.SetBuildEnvironmentImage("Golang:1.26"),
			want:   `spec.image: Invalid value: "Golang:1.26": not a valid image reference (invalid reference format: repository name (library/Golang) must be lowercase); give one such as golang:1.26 or registry.example.com/ci/go@sha256:...`,
		},
		{
			rule: "duplicate container names",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.InitContainers = []corev1.Container{{Name: "db", Image: "busybox:1.37"}}
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17"}}
			},
			want: `spec.sidecars[0].name: Invalid value: "db": already used by spec.initContainers[0].name; every container of the pod (init containers and sidecars) needs its own name`,
		},
		{
			rule:   "reserved container name",
			mutate: gen.SetBuildEnvironmentSidecars(corev1.Container{Name: "agentd-install", Image: "busybox:1.37"}),
			want:   `spec.sidecars[0].name: Invalid value: "agentd-install": "agentd-install" is reserved for a container the operator adds to every job pod; choose another name`,
		},
		{
			rule: "mount with no volume",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}}
			},
			want: `spec.volumeMounts[0].name: Invalid value: "cache": no volume named "cache" in spec.volumes; add the volume there or remove the mount`,
		},
		{
			rule: "volume named workspace",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			},
			want: `spec.volumes[0].name: Invalid value: "workspace": "workspace" is reserved for the volume the operator mounts at /workspace in every container; choose another name (configure the workspace itself with spec.workspace)`,
		},
		{
			rule: "mount at /workspace",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{cache}
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", VolumeMounts: []corev1.VolumeMount{{Name: "cache", MountPath: "/workspace/"}}}}
			},
			want: `spec.sidecars[0].volumeMounts[0].mountPath: Invalid value: "/workspace/": /workspace is where the operator mounts the job's workspace; mount this volume elsewhere, such as /cache`,
		},
		{
			rule: "unknown resource name",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.Resources.Limits["cpus"] = resource.MustParse("2")
			},
			want: `spec.resources.limits[cpus]: Invalid value: "cpus": not a resource Kubernetes knows; use cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as nvidia.com/gpu`,
		},
		{
			rule: "negative quantity",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.MaxResources[corev1.ResourceMemory] = resource.MustParse("-1Gi")
			},
			want: `spec.maxResources[memory]: Invalid value: "-1Gi": must not be negative`,
		},
		{
			rule: "request above limit",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("3")
			},
			want: `spec.resources.requests[cpu]: Invalid value: "3": must be less than or equal to the cpu limit of 2; lower the request or raise the limit`,
		},
		{
			rule:   "default resources above the maximum",
			mutate: func(e *bkv1.BuildEnvironment) { e.Spec.MaxResources[corev1.ResourceMemory] = resource.MustParse("2Gi") },
			want:   `spec.resources.limits[memory]: Invalid value: "4Gi": exceeds the maximum of 2Gi set by spec.maxResources; lower it or raise spec.maxResources`,
		},
		{
			rule:   "pipeline pattern that does not compile",
			mutate: gen.SetBuildEnvironmentAllowedPipelines("my-*", "payments-[a"),
			want:   `spec.allowedPipelines[1]: Invalid value: "payments-[a": not a valid pattern (syntax error in pattern); use path.Match globs such as "payments-*", "deploy-?" or "*", and escape a literal [ ] * ? or \ with \`,
		},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c, _ := newClient(t)
			e := environment("bad-env", tc.mutate)
			err := c.Create(ctx, e)
			require.Error(t, err, "the API server accepted an invalid BuildEnvironment")
			assert.EqualError(t, err, envDenied(e.Name, tc.want))
		})
	}
}

// Each setting that needs a privilege is refused by the webhook until the environment
// allows it: the same table the validation and pod builder tests use.
func TestBuildEnvironmentPrivileges(t *testing.T) {
	ctx := context.Background()
	for i, tc := range validationtest.PrivilegeCases() {
		t.Run(tc.Name, func(t *testing.T) {
			c, _ := newClient(t)
			e := environment(fmt.Sprintf("privileged-%d", i), tc.Set)
			err := c.Create(ctx, e)
			require.Error(t, err, "the API server accepted an environment that uses a privilege it does not allow")
			assert.EqualError(t, err, envDenied(e.Name, tc.Want))

			tc.Allow(&e.Spec.Allow)
			require.NoError(t, c.Create(ctx, e), "with the allow")
			t.Cleanup(func() { _ = env.Client.Delete(ctx, e) })
		})
	}
}

func TestBuildEnvironmentAcceptedWithWarnings(t *testing.T) {
	ctx := context.Background()
	hostPath := corev1.Volume{Name: "docker", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/docker.sock"}}}
	for _, tc := range []struct {
		name   string
		mutate gen.BuildEnvironmentModifier
		want   []string
	}{
		{name: "valid, nothing risky"},
		{
			name: "risky but legal",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.Image = "golang:latest"
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres"}}
				e.Spec.Resources.Limits = nil
				e.Spec.Resources.Requests = nil
				e.Spec.AutomountServiceAccountToken = true
				e.Spec.ServiceAccountName = "ci"
				e.Spec.Allow.ServiceAccount = true
				e.Spec.AllowedPipelines = nil
			},
			want: []string{
				`spec.image: "golang:latest" runs whatever the registry tags latest, so the same build may get a different image tomorrow; pin a version or a digest`,
				`spec.sidecars[0].image: "postgres" runs whatever the registry tags latest, so the same build may get a different image tomorrow; pin a version or a digest`,
				`spec.resources.limits: not set, so one job can use all the CPU and memory of its node; set limits to protect the other pods there`,
				`spec.automountServiceAccountToken: every job gets a Kubernetes API token for service account "ci"; make sure its RBAC grants only what jobs need`,
				`spec.allowedPipelines: empty, so every pipeline of the organization may use this environment; list the pipelines that may, such as "payments-*"`,
			},
		},
		{
			name: "privileged and hostPath when allowed",
			mutate: func(e *bkv1.BuildEnvironment) {
				e.Spec.Allow = bkv1.Allow{Privileged: true, HostPath: true}
				e.Spec.Volumes = []corev1.Volume{hostPath}
				e.Spec.Sidecars = []corev1.Container{{Name: "dind", Image: "docker:27-dind", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
					VolumeMounts: []corev1.VolumeMount{{Name: "docker", MountPath: "/var/run/docker.sock"}}}}
			},
			want: []string{`spec.allow: privileged containers and hostPath volumes let any job of this environment take over its node; allow them only for pipelines you trust with the node (spec.allowedPipelines)`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, w := newClient(t)
			e := environment(fmt.Sprintf("ok-%d", len(tc.want)), tc.mutate)
			require.NoError(t, c.Create(ctx, e))
			t.Cleanup(func() { _ = env.Client.Delete(ctx, e) })
			// The API server may append its own warnings (none expected here); ours come in order.
			assert.Equal(t, tc.want, w.take())
		})
	}
}

func TestBuildEnvironmentUpdate(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t)
	e := environment("updated")
	require.NoError(t, c.Create(ctx, e))

	e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	err := c.Update(ctx, e)
	require.Error(t, err, "an update that makes the environment privileged must be refused")
	assert.EqualError(t, err, envDenied(e.Name, `spec.securityContext.privileged: Forbidden: a privileged container can reach the node and every pod on it; allow it with spec.allow.privileged: true`))

	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(e), e))
	e.Labels = map[string]string{"team": "payments"}
	require.NoError(t, c.Update(ctx, e), "a metadata-only update passes")
	require.NoError(t, c.Delete(ctx, e))
}
