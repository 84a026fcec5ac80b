package validation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

func q(s string) resource.Quantity { return resource.MustParse(s) }

func testEnv(mods ...gen.BuildEnvironmentModifier) *bkv1.BuildEnvironment {
	return gen.BuildEnvironmentFrom(gen.BuildEnvironment("go",
		gen.SetBuildEnvironmentNamespace("ci"),
		gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("500m")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("4Gi")},
		}),
		gen.SetBuildEnvironmentMaxResources(corev1.ResourceList{corev1.ResourceCPU: q("4"), corev1.ResourceMemory: q("8Gi")}),
		gen.SetBuildEnvironmentTimeouts(30, 120),
		gen.SetBuildEnvironmentAllowedPipelines("my-*", "tools"),
	), mods...)
}

func testJob(mods ...gen.BuildJobModifier) *bkv1.BuildJob {
	return gen.BuildJobFrom(gen.BuildJob("j",
		gen.SetBuildJobNamespace("ci"),
		gen.SetBuildJobBuildNumber(7),
		gen.SetBuildJobStepKey("test"),
		gen.SetBuildJobEnvironment("go"),
	), mods...)
}

func messages(errs field.ErrorList) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

func TestBuildJob(t *testing.T) {
	limitRange := corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "caps", Namespace: "ci"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
			{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceMemory: q("6Gi")}},
			{Type: corev1.LimitTypePod, Max: corev1.ResourceList{corev1.ResourceCPU: q("3")}},
			{Type: corev1.LimitTypePersistentVolumeClaim, Max: corev1.ResourceList{corev1.ResourceStorage: q("1Gi")}},
		}},
	}
	for _, tc := range []struct {
		name     string
		job      gen.BuildJobModifier
		env      *bkv1.BuildEnvironment // nil: does not exist
		limits   []corev1.LimitRange
		want     []string
		warnings []string
	}{
		{name: "valid", env: testEnv(), limits: []corev1.LimitRange{limitRange}},
		{name: "valid, pattern match", job: gen.SetBuildJobPipeline("tools"), env: testEnv()},
		{
			name: "no environment named",
			job:  gen.SetBuildJobEnvironment(""),
			want: []string{`spec.buildEnvironment: Required value: The step names no BuildEnvironment and the operator has no default one: name the BuildEnvironment the job runs in with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env). No BuildEnvironment that can run jobs allows pipeline "my-app"; ask a cluster operator for one.`},
		},
		{
			name: "environment missing",
			want: []string{`spec.buildEnvironment: Invalid value: "go": BuildEnvironment "go" does not exist. No BuildEnvironment that can run jobs allows pipeline "my-app"; ask a cluster operator for one.`},
		},
		{
			name: "environment missing and every other problem too",
			job: func(j *bkv1.BuildJob) {
				j.Spec.Command = " \n"
				j.Spec.LogPaths = []string{"/ok.log", "rel.log", "/a/../b"}
			},
			want: []string{
				`spec.buildEnvironment: Invalid value: "go": BuildEnvironment "go" does not exist. No BuildEnvironment that can run jobs allows pipeline "my-app"; ask a cluster operator for one.`,
				`spec.logPaths[1]: Invalid value: "rel.log": logPaths must be absolute paths, such as /workspace/service.log`,
				`spec.logPaths[2]: Invalid value: "/a/../b": logPaths must not contain '..': name the file by its absolute path`,
				`spec.command: Required value: the step has no command and no plugin that could provide one; give the step a command`,
			},
		},
		{
			name: "pipeline not allowed",
			job:  gen.SetBuildJobPipeline("payments"),
			env:  testEnv(),
			want: []string{`spec.pipelineSlug: Forbidden: The pipeline "payments" may not use BuildEnvironment "go", which is for pipelines matching "my-*", "tools". No BuildEnvironment that can run jobs allows pipeline "payments"; ask a cluster operator for one.`},
		},
		{
			name: "environment with an invalid image",
			env: testEnv(func(e *bkv1.BuildEnvironment) {
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres::17"}}
			}),
			want: []string{`spec.buildEnvironment: Invalid value: "go": BuildEnvironment "go" cannot run jobs until a cluster operator fixes it (1 problem, listed in its Ready condition).`},
		},
		{
			name: "requests and limits above the environment's maximum",
			job: gen.SetBuildJobResources(corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q("5")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: q("6"), corev1.ResourceMemory: q("16Gi")},
			}),
			env: testEnv(),
			want: []string{
				`spec.resources.requests[cpu]: Invalid value: "5": exceeds the maximum of 4 that BuildEnvironment "go" allows (spec.maxResources); ask for less`,
				`spec.resources.limits[cpu]: Invalid value: "6": exceeds the maximum of 4 that BuildEnvironment "go" allows (spec.maxResources); ask for less`,
				`spec.resources.limits[memory]: Invalid value: "16Gi": exceeds the maximum of 8Gi that BuildEnvironment "go" allows (spec.maxResources); ask for less`,
			},
		},
		{
			name:   "above the LimitRange (container and pod maximums), including the environment's own values",
			job:    gen.SetBuildJobResources(corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: q("7Gi")}}),
			env:    testEnv(func(e *bkv1.BuildEnvironment) { e.Spec.Resources.Limits[corev1.ResourceCPU] = q("3500m") }),
			limits: []corev1.LimitRange{limitRange},
			want: []string{
				`spec.resources.limits[cpu]: Invalid value: "3500m": exceeds the maximum of 3 per container set by LimitRange "caps" in namespace "ci" (this value comes from BuildEnvironment "go" spec.resources.limits); ask for at most 3`,
				`spec.resources.limits[memory]: Invalid value: "7Gi": exceeds the maximum of 6Gi per container set by LimitRange "caps" in namespace "ci"; ask for at most 6Gi`,
			},
		},
		{
			name: "job request above the environment's limit",
			job:  gen.SetBuildJobResources(corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("3")}}),
			env:  testEnv(),
			want: []string{`spec.resources.requests[cpu]: Invalid value: "3": must be less than or equal to the cpu limit of 2 (this value comes from BuildEnvironment "go" spec.resources.limits); lower the request or raise the limit`},
		},
		{
			name: "unknown and negative resources",
			job:  gen.SetBuildJobResources(corev1.ResourceRequirements{Requests: corev1.ResourceList{"gpu": q("1"), corev1.ResourceMemory: q("-1")}}),
			env:  testEnv(),
			want: []string{
				`spec.resources.requests[gpu]: Invalid value: "gpu": not a resource Kubernetes knows; use cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as nvidia.com/gpu`,
				`spec.resources.requests[memory]: Invalid value: "-1": must not be negative`,
			},
		},
		{
			name: "no command, Command runner",
			job:  gen.SetBuildJobCommand(""),
			env:  testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
			want: []string{`spec.command: Required value: BuildEnvironment "go" runs the step's command itself (runner Command), so the step needs a command; give the step a command, or use an environment with runner Bootstrap if a plugin provides it`},
		},
		{
			name: "no command, Bootstrap runner with a plugin",
			job: func(j *bkv1.BuildJob) {
				j.Spec.Command = ""
				j.Spec.Env = map[string]string{"BUILDKITE_PLUGINS": `[{"docker#v5.0.0":{"image":"node"}}]`}
			},
			env: testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerBootstrap)),
		},
		{
			// The spawner keeps the job's env in its token Secret and lists only the names.
			name: "no command, Bootstrap runner with plugins in the env Secret",
			job: func(j *bkv1.BuildJob) {
				j.Spec.Command = ""
				j.Spec.EnvNames = []string{"BUILDKITE_PLUGINS", "BUILDKITE_REPO"}
			},
			env: testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerBootstrap)),
		},
		{
			name: "no command, default runner, no plugins",
			job:  gen.SetBuildJobCommand(""),
			env:  testEnv(),
			want: []string{`spec.command: Required value: the step has no command and no plugin that could provide one; give the step a command`},
		},
		{
			name: "no command, Bootstrap runner, plugins empty",
			job: func(j *bkv1.BuildJob) {
				j.Spec.Command = ""
				j.Spec.Env = map[string]string{"BUILDKITE_PLUGINS": `[]`}
			},
			env:  testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerBootstrap)),
			want: []string{`spec.command: Required value: the step has no command and no plugin that could provide one; give the step a command`},
		},
		{
			name: "plugins and artifact_paths, default runner",
			job: gen.SetBuildJobEnv(map[string]string{
				"BUILDKITE_PLUGINS": `[{"docker#v5.0.0":{"image":"node"}}]`, "BUILDKITE_ARTIFACT_PATHS": "dist/*",
			}),
			env: testEnv(),
		},
		{
			name: "plugins, Command runner",
			job:  gen.SetBuildJobEnv(map[string]string{"BUILDKITE_PLUGINS": `[{"docker#v5.0.0":{"image":"node"}}]`, "BUILDKITE_ARTIFACT_PATHS": ""}),
			env:  testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
			want: []string{`spec.env[BUILDKITE_PLUGINS]: Forbidden: BuildEnvironment "go" runs only the step's command (runner Command), without the step's plugins; choose an environment whose runner is Bootstrap (the default) with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env), or ask a cluster operator for one`},
		},
		{
			// The spawner keeps the job's env in its token Secret: a listed BUILDKITE_PLUGINS
			// holds plugins other than the operator's (it drops the variable otherwise).
			name: "plugins in the env Secret, Command runner",
			job:  func(j *bkv1.BuildJob) { j.Spec.EnvNames = []string{"BUILDKITE_ARTIFACT_PATHS", "BUILDKITE_PLUGINS"} },
			env:  testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
			want: []string{`spec.env[BUILDKITE_PLUGINS]: Forbidden: BuildEnvironment "go" runs only the step's command (runner Command), without the step's plugins; choose an environment whose runner is Bootstrap (the default) with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env), or ask a cluster operator for one`},
		},
		{
			name: "artifact_paths, Command runner",
			job:  gen.SetBuildJobEnv(map[string]string{"BUILDKITE_ARTIFACT_PATHS": "dist/*;logs/*.log"}),
			env:  testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
			want: []string{`spec.env[BUILDKITE_ARTIFACT_PATHS]: Forbidden: BuildEnvironment "go" runs only the step's command (runner Command), without uploading the step's artifact_paths; choose an environment whose runner is Bootstrap (the default) with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env), or ask a cluster operator for one`},
		},
		{
			name: "only the operator's own plugin, Command runner",
			job: gen.SetBuildJobEnv(map[string]string{
				"BUILDKITE_PLUGINS": `[{"https://github.com/buildkite-operator/buildkite-operator.git#v0.1.0":{"build_environment":"go"}}]`,
			}),
			env: testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
		},
		{
			name: "plugins in an environment that disables them",
			job:  gen.SetBuildJobEnv(map[string]string{"BUILDKITE_PLUGINS": `[{"docker#v5.0.0":null}]`}),
			env:  testEnv(func(e *bkv1.BuildEnvironment) { e.Spec.Agent.Plugins = bkv1.PluginsDisabled }),
			want: []string{`spec.env[BUILDKITE_PLUGINS]: Forbidden: BuildEnvironment "go" runs no plugins (its agent settings disable them); remove the step's plugins, or choose another environment with the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env)`},
		},
		{
			name: "timeout above the maximum",
			job:  gen.SetBuildJobTimeoutMinutes(121),
			env:  testEnv(),
			want: []string{`spec.timeoutMinutes: Invalid value: 121: exceeds the maximum of 120 minutes that BuildEnvironment "go" allows (spec.timeouts.maxMinutes); set the step's timeout_in_minutes to at most 120`},
		},
		{
			name: "step timeout above the maximum, not yet defaulted",
			job:  gen.SetBuildJobEnv(map[string]string{"BUILDKITE_TIMEOUT": "240"}),
			env:  testEnv(),
			want: []string{`spec.env[BUILDKITE_TIMEOUT]: Invalid value: 240: exceeds the maximum of 120 minutes that BuildEnvironment "go" allows (spec.timeouts.maxMinutes); set the step's timeout_in_minutes to at most 120`},
		},
		{
			name: "malformed step timeout, even when timeoutMinutes is set",
			job: func(j *bkv1.BuildJob) {
				j.Spec.TimeoutMinutes = ptr.To[int32](10)
				j.Spec.Env = map[string]string{"BUILDKITE_TIMEOUT": "0"}
			},
			env:  testEnv(),
			want: []string{`spec.env[BUILDKITE_TIMEOUT]: Invalid value: "0": must be a whole number of minutes greater than 0, or "false" for no timeout`},
		},
		{
			name:     "no timeout anywhere",
			env:      testEnv(func(e *bkv1.BuildEnvironment) { e.Spec.Timeouts = bkv1.Timeouts{} }),
			warnings: []string{`spec.timeoutMinutes: not set, and BuildEnvironment "go" has no spec.timeouts.defaultMinutes, so the job runs until it ends or is canceled in Buildkite; give the step a timeout_in_minutes`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, warnings := validation.BuildJob(testJob(tc.job), tc.env, tc.limits, nil)
			assert.Equal(t, tc.want, messages(errs))
			assert.Equal(t, tc.warnings, warnings)
		})
	}
}

func TestBuildEnvironment(t *testing.T) {
	emptyDir := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	for _, tc := range []struct {
		name     string
		env      gen.BuildEnvironmentModifier
		want     []string
		warnings []string
	}{
		{name: "valid"},
		{
			name: "digest-pinned images and a nested workspace mount are fine",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Image = "registry.example.com/ci/go@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
				e.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: emptyDir}}
				e.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/workspace/.cache"}}
			},
		},
		{
			name: "no image",
			env:  gen.SetBuildEnvironmentImage(""),
			want: []string{`spec.image: Required value: give an image, such as golang:1.26 or registry.example.com/ci/go@sha256:...`},
		},
		{
			name: "container names: empty, reserved, duplicate, not a DNS label",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.InitContainers = []corev1.Container{{Name: "", Image: "busybox:1"}, {Name: "job", Image: "busybox:1"}, {Name: "setup", Image: "busybox:1"}}
				e.Spec.Sidecars = []corev1.Container{{Name: "setup", Image: "busybox:1"}, {Name: "Redis_1", Image: "redis:7"}}
			},
			want: []string{
				`spec.initContainers[0].name: Required value: give the container a name, such as postgres`,
				`spec.initContainers[1].name: Invalid value: "job": "job" is reserved for a container the operator adds to every job pod; choose another name`,
				`spec.sidecars[0].name: Invalid value: "setup": already used by spec.initContainers[2].name; every container of the pod (init containers and sidecars) needs its own name`,
				`spec.sidecars[1].name: Invalid value: "Redis_1": must be lowercase letters, digits and '-', starting and ending with a letter or digit, such as postgres`,
			},
		},
		{
			name: "volumes and mounts",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: emptyDir}, {Name: "cache", VolumeSource: emptyDir}, {Name: "agentd-bin", VolumeSource: emptyDir}, {Name: "buildkite-agent-image", VolumeSource: emptyDir}}
				e.Spec.VolumeMounts = []corev1.VolumeMount{
					{Name: "cache", MountPath: "/cache"}, {Name: "missing", MountPath: "/cache/"},
					{Name: "workspace", MountPath: "/src"}, {Name: "cache", MountPath: "/buildkite-operator"},
					{Name: "workspace", MountPath: "/buildkite-operator/agent/"}, {Name: "workspace", MountPath: "/buildkite-operator-cache"},
				}
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", VolumeMounts: []corev1.VolumeMount{
					{Name: "workspace", MountPath: "/workspace"}, {Name: "cache", MountPath: "/buildkite-operator"},
				}}}
			},
			want: []string{
				`spec.volumes[1].name: Invalid value: "cache": already used by spec.volumes[0]; every volume needs its own name`,
				`spec.volumes[2].name: Invalid value: "agentd-bin": "agentd-bin" is reserved for a volume the operator adds to every job pod; choose another name`,
				`spec.volumes[3].name: Invalid value: "buildkite-agent-image": "buildkite-agent-image" is reserved for a volume the operator adds to every job pod; choose another name`,
				`spec.volumeMounts[1].name: Invalid value: "missing": no volume named "missing" in spec.volumes; add the volume there or remove the mount`,
				`spec.volumeMounts[1].mountPath: Invalid value: "/cache/": already used by spec.volumeMounts[0]; a container can mount only one volume at a path`,
				`spec.volumeMounts[3].mountPath: Invalid value: "/buildkite-operator": /buildkite-operator is where the operator puts its supervisor and buildkite-agent in the job's container; mount this volume elsewhere`,
				`spec.volumeMounts[4].mountPath: Invalid value: "/buildkite-operator/agent/": /buildkite-operator is where the operator puts its supervisor and buildkite-agent in the job's container; mount this volume elsewhere`,
				`spec.sidecars[0].volumeMounts[0].mountPath: Invalid value: "/workspace": /workspace is where the operator mounts the job's workspace; mount this volume elsewhere, such as /cache`,
			},
		},
		{
			name: "privileged init container and hostPath",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.InitContainers = []corev1.Container{{Name: "sysctl", Image: "busybox:1", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
				e.Spec.Volumes = []corev1.Volume{{Name: "sock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run"}}}}
			},
			want: []string{
				`spec.initContainers[0].securityContext.privileged: Forbidden: a privileged container can reach the node and every pod on it; allow it with spec.allow.privileged: true`,
				`spec.volumes[0].hostPath: Forbidden: hostPath volumes give jobs the node's files; allow them with spec.allow.hostPath: true`,
			},
		},
		{
			name: "privileged false is not privileged",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(false)}
			},
		},
		{
			name: "sidecar resources",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: q("2Gi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: q("1Gi"), "example.com/fpga": q("1")},
				}}}
			},
			want: []string{`spec.sidecars[0].resources.requests[memory]: Invalid value: "2Gi": must be less than or equal to the memory limit of 1Gi; lower the request or raise the limit`},
		},
		{
			name: "bad pipeline patterns",
			env:  gen.SetBuildEnvironmentAllowedPipelines("ok-*", `trailing\`, "[z-a"),
			want: []string{
				`spec.allowedPipelines[1]: Invalid value: "trailing\\": not a valid pattern (syntax error in pattern); use path.Match globs such as "payments-*", "deploy-?" or "*", and escape a literal [ ] * ? or \ with \`,
				`spec.allowedPipelines[2]: Invalid value: "[z-a": not a valid pattern (syntax error in pattern); use path.Match globs such as "payments-*", "deploy-?" or "*", and escape a literal [ ] * ? or \ with \`,
			},
		},
		{
			name: "untagged image, no limits",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Image = "ghcr.io/acme/ci"
				e.Spec.Resources.Limits = nil
			},
			warnings: []string{
				`spec.image: "ghcr.io/acme/ci" runs whatever the registry tags latest, so the same build may get a different image tomorrow; pin a version or a digest`,
				`spec.resources.limits: not set, so one job can use all the CPU and memory of its node; set limits to protect the other pods there`,
			},
		},
		{
			name: "agent settings, all of them",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{{Name: "mirrors", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "git-mirrors"}}}}
				e.Spec.Allow.PersistentVolumeClaims = []string{"git-mirrors"}
				e.Spec.TerminationGracePeriodSeconds = ptr.To[int64](60)
				e.Spec.Agent = bkv1.AgentSettings{
					HooksConfigMap: "ci-hooks", Plugins: bkv1.PluginsValidated,
					GitCloneFlags: "-v --depth=100", GitFetchFlags: "-v --prune --depth=100",
					GitMirrorsVolume: "mirrors", RedactedVars: []string{"*_CREDENTIALS", "DEPLOY_KEY"},
					CancelGracePeriodSeconds: ptr.To[int32](50),
				}
			},
		},
		{
			name: "agent settings that cannot work",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Volumes = []corev1.Volume{{Name: "buildkite-hooks", VolumeSource: emptyDir}, {Name: "cache", VolumeSource: emptyDir}}
				e.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/buildkite/hooks/"}, {Name: "cache", MountPath: "/buildkite/git-mirrors"}}
				e.Spec.TerminationGracePeriodSeconds = ptr.To[int64](30)
				e.Spec.Agent = bkv1.AgentSettings{
					HooksConfigMap: "CI_hooks", GitCloneFlags: "-v\n--depth=1", GitMirrorsVolume: "mirrors",
					RedactedVars: []string{"", "[A-"}, CancelGracePeriodSeconds: ptr.To[int32](30),
				}
			},
			want: []string{
				`spec.volumes[0].name: Invalid value: "buildkite-hooks": "buildkite-hooks" is reserved for a volume the operator adds to every job pod; choose another name`,
				`spec.agent.hooksConfigMap: Invalid value: "CI_hooks": not a ConfigMap name: lowercase letters, digits, '-' and '.', such as ci-hooks`,
				`spec.volumeMounts[0].mountPath: Invalid value: "/buildkite/hooks/": /buildkite/hooks is where the operator mounts spec.agent.hooksConfigMap in the job's container; mount this volume elsewhere`,
				`spec.agent.gitMirrorsVolume: Invalid value: "mirrors": no volume named "mirrors" in spec.volumes; add the volume (a PersistentVolumeClaim, usually ReadWriteMany) there`,
				`spec.volumeMounts[1].mountPath: Invalid value: "/buildkite/git-mirrors": /buildkite/git-mirrors is where the operator mounts spec.agent.gitMirrorsVolume in the job's container; mount this volume elsewhere`,
				`spec.agent.gitCloneFlags: Invalid value: "-v\n--depth=1": must be one line of flags, such as -v --depth=1`,
				`spec.agent.redactedVars[0]: Required value: give a pattern of variable names, such as *_CREDENTIALS`,
				`spec.agent.redactedVars[1]: Invalid value: "[A-": not a valid pattern (syntax error in pattern); use path.Match globs such as *_CREDENTIALS`,
				`spec.agent.cancelGracePeriodSeconds: Invalid value: 30: must be less than spec.terminationGracePeriodSeconds (30), or the kubelet kills the job before its cancel grace period ends; lower it or raise spec.terminationGracePeriodSeconds`,
			},
		},
		{
			name: "hooks and git mirrors under the Command runner",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.Runner = bkv1.RunnerCommand
				e.Spec.Volumes = []corev1.Volume{{Name: "mirrors", VolumeSource: emptyDir}}
				e.Spec.Agent = bkv1.AgentSettings{HooksConfigMap: "ci-hooks", GitMirrorsVolume: "mirrors"}
			},
			want: []string{
				`spec.agent.hooksConfigMap: Invalid value: "ci-hooks": only the Bootstrap runner runs agent hooks; set spec.runner to Bootstrap or remove the hooks`,
				`spec.agent.gitMirrorsVolume: Invalid value: "mirrors": only the Bootstrap runner checks out from git mirrors; set spec.runner to Bootstrap or remove the mirrors`,
			},
		},
		{
			name: "service account token for the default account",
			env: func(e *bkv1.BuildEnvironment) {
				e.Spec.AutomountServiceAccountToken = true
				e.Spec.Allow.ServiceAccount = true
			},
			warnings: []string{
				`spec.automountServiceAccountToken: every job gets a Kubernetes API token for service account "default"; make sure its RBAC grants only what jobs need`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, warnings := validation.BuildEnvironment(testEnv(tc.env))
			assert.Equal(t, tc.want, messages(errs))
			assert.Equal(t, tc.warnings, warnings)
		})
	}
}

func TestPipelineAllowed(t *testing.T) {
	for _, tc := range []struct {
		patterns []string
		slug     string
		want     bool
	}{
		{nil, "anything", true},
		{[]string{"*"}, "anything", true},
		{[]string{"payments-*"}, "payments-api", true},
		{[]string{"payments-*"}, "payment", false},
		{[]string{"deploy-?"}, "deploy-1", true},
		{[]string{"deploy-?"}, "deploy-12", false},
		{[]string{"[a-"}, "a", false}, // a broken pattern fails closed
		{[]string{"[a-", "a"}, "a", true},
	} {
		env := testEnv(gen.SetBuildEnvironmentAllowedPipelines(tc.patterns...))
		assert.Equal(t, tc.want, validation.PipelineAllowed(env, tc.slug), "%q against %q", tc.slug, tc.patterns)
	}
}

func TestApplyDefaults(t *testing.T) {
	for _, tc := range []struct {
		name        string
		job         gen.BuildJobModifier
		env         *bkv1.BuildEnvironment
		wantEnv     string
		wantTimeout *int32
		wantLabels  map[string]string
	}{
		{
			name:        "default environment, its default timeout",
			job:         gen.SetBuildJobEnvironment(""),
			env:         testEnv(),
			wantEnv:     "fallback",
			wantTimeout: ptr.To[int32](30),
		},
		{
			name:        "step timeout wins over the environment's default",
			job:         gen.SetBuildJobEnv(map[string]string{"BUILDKITE_TIMEOUT": "15"}),
			env:         testEnv(),
			wantEnv:     "go",
			wantTimeout: ptr.To[int32](15),
		},
		{
			name:    "malformed step timeout is left for validation to report",
			job:     gen.SetBuildJobEnv(map[string]string{"BUILDKITE_TIMEOUT": "1h"}),
			env:     testEnv(),
			wantEnv: "go",
		},
		{
			name:    "environment missing: no timeout",
			wantEnv: "go",
		},
		{
			name: "step key with odd characters, no step key",
			job: func(j *bkv1.BuildJob) {
				j.Spec.StepKey = ""
				j.Labels = map[string]string{bkv1.LabelStep: "stale", "team": "payments"}
			},
			wantEnv:    "go",
			wantLabels: map[string]string{bkv1.LabelStep: "", "team": "payments"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := testJob(tc.job)
			validation.ApplyDefaults(j, "fallback", tc.env)
			assert.Equal(t, tc.wantEnv, j.Spec.BuildEnvironment)
			assert.Equal(t, tc.wantTimeout, j.Spec.TimeoutMinutes)
			want := map[string]string{
				bkv1.LabelPipeline: "my-app", bkv1.LabelBuild: "7", bkv1.LabelStep: "test",
				bkv1.LabelJob: j.Spec.JobID, bkv1.LabelEnvironment: tc.wantEnv,
			}
			for k, v := range tc.wantLabels {
				if v == "" {
					delete(want, k)
				} else {
					want[k] = v
				}
			}
			assert.Equal(t, want, j.Labels)
		})
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"test":                         "test",
		":go: unit tests":              "go--unit-tests",
		"deploy/prod":                  "deploy-prod",
		"___":                          "",
		"a" + string(make([]byte, 70)): "a",
		"x1234567890123456789012345678901234567890123456789012345678901234567890": "x12345678901234567890123456789012345678901234567890123456789012",
	} {
		assert.Equal(t, want, validation.LabelValue(in), "LabelValue(%q)", in)
	}
}

func TestStepTimeout(t *testing.T) {
	for _, tc := range []struct {
		value   *string
		minutes int32
		ok      bool
		err     bool
	}{
		{value: nil},
		{value: ptr.To("")},
		{value: ptr.To("false")},
		{value: ptr.To("60"), minutes: 60, ok: true},
		{value: ptr.To("0"), err: true},
		{value: ptr.To("-5"), err: true},
		{value: ptr.To("ten"), err: true},
		{value: ptr.To("99999999999"), err: true},
	} {
		env := map[string]string{}
		if tc.value != nil {
			env[validation.EnvTimeout] = *tc.value
		}
		minutes, ok, err := validation.StepTimeout(env)
		assert.Equal(t, tc.minutes, minutes, "%v", tc.value)
		assert.Equal(t, tc.ok, ok, "%v", tc.value)
		assert.Equal(t, tc.err, err != nil, "%v: %v", tc.value, err)
	}
}

func TestEffectiveResources(t *testing.T) {
	env := &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: q("1"), corev1.ResourceMemory: q("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: q("2Gi")},
	}
	job := &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("2")}, Limits: corev1.ResourceList{corev1.ResourceCPU: q("3")}}
	got := validation.EffectiveResources(job, env)
	assert.True(t, q("2").Equal(got.Requests[corev1.ResourceCPU]))
	assert.True(t, q("1Gi").Equal(got.Requests[corev1.ResourceMemory]))
	assert.True(t, q("3").Equal(got.Limits[corev1.ResourceCPU]))
	assert.True(t, q("2Gi").Equal(got.Limits[corev1.ResourceMemory]))
	assert.True(t, q("1").Equal(env.Requests[corev1.ResourceCPU]), "the environment is not modified")
	assert.Empty(t, validation.EffectiveResources(nil, nil).Requests)
}

func TestInvalidErrorsReadLikeKubectl(t *testing.T) {
	j := testJob(gen.SetBuildJobCommand(""))
	errs, _ := validation.BuildJob(j, testEnv(gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)), nil, nil)
	err := validation.InvalidBuildJob(j, errs)
	require.Error(t, err)
	assert.Equal(t, `BuildJob.buildkite-operator.dev "j" is invalid: spec.command: Required value: BuildEnvironment "go" runs the step's command itself (runner Command), so the step needs a command; give the step a command, or use an environment with runner Bootstrap if a plugin provides it`, err.Error())
	assert.NoError(t, validation.InvalidBuildJob(j, nil))
}
