package podbuilder

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ with the pods built now")

const jobID = "0190b8c4-1f2a-4c3d-9e8f-0123456789ab"

// baseJob is a BuildJob as the spawner makes it, with its intake annotation; handMade
// takes the annotation away.
func baseJob() *bkv1.BuildJob {
	job := gen.BuildJob(jobID,
		gen.SetBuildJobNamespace("ci"),
		gen.SetBuildJobUID("7b7e4c1e-0000-4000-8000-000000000001"),
		gen.AddBuildJobLabels(map[string]string{
			bkv1.LabelPipeline:    "my-app",
			bkv1.LabelBuild:       "42",
			bkv1.LabelJob:         jobID,
			bkv1.LabelEnvironment: "go",
		}),
		gen.SetBuildJobJobID(jobID),
		gen.SetBuildJobBuildURL("https://buildkite.com/acme/my-app/builds/42"),
		gen.SetBuildJobStepLabel(":go: test"),
		gen.SetBuildJobEnv(map[string]string{"BUILDKITE_BRANCH": "main", "BUILDKITE_JOB_ID": jobID, "CI": "true"}),
		gen.SetBuildJobLogLimits(bkv1.LogLimits{ChunksMaxSizeBytes: 102400, ChunksIntervalSeconds: 1}),
	)
	job.Annotations = map[string]string{bkv1.AnnotationIntake: "nonce-drawn-by-the-spawner"}
	return job
}

// handMade makes job a BuildJob made by hand: no intake annotation.
func handMade(job *bkv1.BuildJob) {
	delete(job.Annotations, bkv1.AnnotationIntake)
}

func baseEnv() *bkv1.BuildEnvironment {
	return gen.BuildEnvironment("go",
		gen.SetBuildEnvironmentNamespace("ci"),
		gen.SetBuildEnvironmentImagePullPolicy(corev1.PullIfNotPresent),
		gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand),
	)
}

func TestBuildGolden(t *testing.T) {
	cases := []struct {
		name   string
		change func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment)
		// level is the job namespace's Pod Security level; none when empty.
		level PodSecurityLevel
		// pullSecrets are the operator's image pull secrets (Options.ImagePullSecrets).
		pullSecrets []corev1.LocalObjectReference
		// binaries is Options.Binaries; the default when empty.
		binaries Binaries
	}{
		{name: "default-env", change: func(*bkv1.BuildJob, *bkv1.BuildEnvironment) {}},
		{name: "bootstrap-runner", change: func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Image = "bk-operator/job:dev"
			env.Spec.ImagePullPolicy = corev1.PullNever
			job.Spec.LogPaths = []string{"/workspace/service.log", "/tmp/db.log"}
			job.Spec.AgentEndpoint = "http://10.88.0.1:8080/v3"
			job.Spec.TimeoutMinutes = ptr(int32(30))
		}},
		{name: "pvc-workspace", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			env.Spec.Workspace.VolumeClaimTemplate = &corev1.PersistentVolumeClaimTemplate{
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: ptr("fast"),
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceStorage: resource.MustParse("20Gi"),
					}},
				},
			}
			env.Spec.Timeouts.DefaultMinutes = ptr(int32(60))
		}},
		{name: "sidecars-and-init-containers", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			env.Spec.InitContainers = []corev1.Container{{
				Name: "fetch-cache", Image: "busybox:1.36", Command: []string{"sh", "-c", "cp -r /cache/. /workspace/"},
				VolumeMounts: []corev1.VolumeMount{{Name: "cache", MountPath: "/cache"}},
			}}
			env.Spec.Sidecars = []corev1.Container{{
				Name: "postgres", Image: "postgres:17",
				Env: []corev1.EnvVar{{Name: "POSTGRES_PASSWORD", Value: "test"}},
			}}
			env.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{
				ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "build-cache"}},
			}}}
			env.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "cache", MountPath: "/cache", ReadOnly: true}}
			env.Spec.Env = []corev1.EnvVar{{Name: "DATABASE_URL", Value: "postgres://postgres:test@localhost/postgres"}}
			env.Spec.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "ci-settings"},
			}}}
			env.Spec.TerminationGracePeriodSeconds = ptr(int64(60))
			env.Spec.PodLabels = map[string]string{"team": "payments"}
			env.Spec.PodAnnotations = map[string]string{"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
		}},
		{name: "resources-override", change: func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			env.Spec.Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("2Gi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
			}
			job.Spec.Resources = &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")},
			}
		}},
		{name: "service-account-with-token", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			env.Spec.ServiceAccountName = "deployer"
			env.Spec.AutomountServiceAccountToken = true
			env.Spec.Allow.ServiceAccount = true
			env.Spec.NodeSelector = map[string]string{"kubernetes.io/arch": "amd64"}
			env.Spec.Tolerations = []corev1.Toleration{{Key: "ci", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
			env.Spec.PriorityClassName = "ci-high"
			env.Spec.Allow.PriorityClasses = []string{"ci-high"}
			env.Spec.Allow.Tolerations = []string{"ci"}
			env.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
			env.Spec.PodSecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: ptr(int64(1000)), FSGroup: ptr(int64(1000))}
			env.Spec.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false)}
		}},
		{name: "env-in-secret", change: func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment) {
			// As the spawner makes them: the names only, the values in the token Secret.
			job.Spec.Env = nil
			job.Spec.EnvNames = []string{"BUILDKITE_BRANCH", "BUILDKITE_JOB_ID", "CI", "DB_PASSWORD"}
		}},
		{name: "long-name", change: func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment) {
			job.Name = "a-buildjob-named-by-hand-with-a-name-much-longer-than-a-hostname-may-be"
		}},
		{name: "made-by-hand", change: func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			// Trying an environment without Buildkite: no token, no endpoint, the
			// env in clear; what names the token Secret is ignored.
			handMade(job)
			env.Spec.Runner = bkv1.RunnerBootstrap
			job.Spec.AgentEndpoint = "http://10.88.0.1:8080/v3"
			job.Spec.EnvNames = []string{"DB_PASSWORD"}
		}},
		{name: "agent-settings", change: func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Volumes = []corev1.Volume{{Name: "mirrors", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "git-mirrors"},
			}}}
			env.Spec.Allow.PersistentVolumeClaims = []string{"git-mirrors"}
			env.Spec.Agent = bkv1.AgentSettings{
				HooksConfigMap:           "ci-hooks",
				Plugins:                  bkv1.PluginsValidated,
				GitCloneFlags:            "-v --depth=100",
				GitFetchFlags:            "-v --prune --depth=100",
				GitMirrorsVolume:         "mirrors",
				RedactedVars:             []string{"*_CREDENTIALS", "*_TOKEN"},
				CancelGracePeriodSeconds: ptr(int32(40)),
			}
			// A step that sets an agent setting in its env: ignored, as on an agent.
			job.Spec.Env["BUILDKITE_BUILD_PATH"] = "/tmp/elsewhere"
		}},
		{name: "agent-image", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			// The environment's own agent image, in a restricted namespace where only the
			// job container names a user: the copy, from an image whose user is root,
			// still runs as a user that is not root.
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Agent.Image = "registry.example.com/ci/agent:3.138.1-custom"
			env.Spec.Agent.ImagePullPolicy = corev1.PullAlways
			env.Spec.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr(int64(2000))}
			env.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
		}, level: PodSecurityRestricted},
		{name: "private-repositories", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			// An SSH key with known_hosts and a git-credentials file, in a restricted
			// namespace: uid 1000, fsGroup 1000, the Secrets readable through the group.
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Git = bkv1.GitSettings{
				SSHSecret:         &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"},
				CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "git-https"},
			}
			env.Spec.Allow.Secrets = []string{"deploy-key", "git-https"}
		}, level: PodSecurityRestricted},
		{name: "private-repositories-username-password", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			// An SSH key without known_hosts, and a username and password for one server,
			// for a job that names its own user and no fsGroup.
			env.Spec.Git = bkv1.GitSettings{
				SSHSecret: &bkv1.GitSSHSecret{Name: "deploy-key", KeyKey: "id_ed25519"},
				CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "github-token", URL: "https://github.com/",
					UsernameKey: "user", PasswordKey: "token"},
			}
			env.Spec.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr(int64(1001)), RunAsNonRoot: ptr(true)}
			env.Spec.Allow.Secrets = []string{"deploy-key", "github-token"}
		}, level: PodSecurityRestricted},
		{name: "operator-pull-secrets", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			// The operator's pull secrets (the chart's imagePullSecrets), for the install
			// and agent init containers, after the environment's own, each once.
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Image = "registry.example.com/ci/job:1"
			env.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "ci-registry"}, {Name: "mirror"}}
		}, pullSecrets: []corev1.LocalObjectReference{{Name: "mirror"}, {Name: "operator-registry"}}},
		{name: "image-volumes", change: func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment) {
			// Both binaries from image volumes, in a restricted namespace: no init
			// container, the environment's agent image and pull policy in its volume.
			env.Spec.Runner = bkv1.RunnerBootstrap
			env.Spec.Agent.Image = "registry.example.com/ci/agent:3.138.1-custom"
			env.Spec.Agent.ImagePullPolicy = corev1.PullAlways
		}, level: PodSecurityRestricted, binaries: BinariesImageVolume},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{AgentEndpoint: "https://agent.buildkite.com/v3", OperatorImagePullPolicy: corev1.PullIfNotPresent,
				AgentImagePullPolicy: corev1.PullIfNotPresent, PodSecurity: tc.level, ImagePullSecrets: tc.pullSecrets,
				Binaries: tc.binaries}
			job, env := baseJob(), baseEnv()
			tc.change(job, env)
			pod, err := Build(job, env, opts)
			require.NoError(t, err)
			got, err := yaml.Marshal(pod)
			require.NoError(t, err)

			golden := filepath.Join("testdata", tc.name+".yaml")
			if *update {
				require.NoError(t, os.WriteFile(golden, got, 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run `go test ./pkg/podbuilder -update` to create the golden file")
			assert.Equal(t, string(want), string(got), "pod differs from %s; if the change is intended, run `go test ./pkg/podbuilder -update`", golden)

			// Pure: building again from the same inputs gives the same pod, and the
			// inputs are untouched.
			job2, env2 := baseJob(), baseEnv()
			tc.change(job2, env2)
			assert.Equal(t, job2, job, "Build changed its BuildJob")
			assert.Equal(t, env2, env, "Build changed its BuildEnvironment")
			again, err := Build(job, env, opts)
			require.NoError(t, err)
			assert.Equal(t, pod, again)

			checkInvariants(t, job, env, pod)
		})
	}
}

// checkInvariants are the promises every job pod keeps, whatever its environment.
func checkInvariants(t *testing.T, job *bkv1.BuildJob, env *bkv1.BuildEnvironment, pod *corev1.Pod) {
	t.Helper()
	assert.LessOrEqual(t, len(pod.Name), 63)
	require.Len(t, pod.OwnerReferences, 1)
	assert.Equal(t, job.UID, pod.OwnerReferences[0].UID)
	assert.True(t, *pod.OwnerReferences[0].Controller)
	assert.Equal(t, corev1.RestartPolicyNever, pod.Spec.RestartPolicy)
	assert.Equal(t, env.Spec.AutomountServiceAccountToken, *pod.Spec.AutomountServiceAccountToken)

	all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range all {
		var mounted bool
		for _, m := range c.VolumeMounts {
			if m.Name == podcontract.WorkspaceVolume && m.MountPath == podcontract.WorkspaceDir {
				mounted = true
			}
		}
		assert.True(t, mounted, "container %s does not mount %s", c.Name, podcontract.WorkspaceDir)
	}
	installs := checkBinaries(t, pod)
	for _, c := range pod.Spec.InitContainers[installs+len(env.Spec.InitContainers):] {
		require.NotNil(t, c.RestartPolicy, "sidecar %s is not a native sidecar", c.Name)
		assert.Equal(t, corev1.ContainerRestartPolicyAlways, *c.RestartPolicy)
	}

	require.Len(t, pod.Spec.Containers, 1)
	c := pod.Spec.Containers[0]
	assert.Equal(t, podcontract.JobContainer, c.Name)
	names := map[string]int{}
	for _, e := range c.Env {
		names[e.Name]++
		assert.NotContains(t, strings.ToLower(e.Value), "bkaj_", "a token value in the pod spec")
	}
	for name, n := range names {
		assert.Equal(t, 1, n, "env %s defined %d times", name, n)
	}
	if bkv1.MadeByHand(job) {
		assertMadeByHand(t, job, pod)
	} else {
		token := envVar(c.Env, podcontract.EnvAccessToken)
		require.NotNil(t, token)
		require.NotNil(t, token.ValueFrom)
		assert.Equal(t, job.Spec.TokenSecretRef.Name, token.ValueFrom.SecretKeyRef.Name)
		assert.Nil(t, envVar(c.Env, podcontract.EnvLocal), "a job from Buildkite runs with Buildkite")
	}
	// As the kubelet gives it to the container: after its expansion of $(NAME) and $$.
	assert.Equal(t, job.Spec.Command, containerEnv(t, c, nil)[podcontract.EnvCommand], "the command reaches the container verbatim")
	assert.Equal(t, job.Namespace+"/"+job.Name, envVar(c.Env, podcontract.EnvPodMarker).Value, "the marker holds the BuildJob namespace/name, as the plugin documents")
}

// checkBinaries checks how pod's job container gets the supervisor and buildkite-agent,
// either way (Binaries), and returns how many init containers that takes.
func checkBinaries(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	c := pod.Spec.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	binPath := envVar(c.Env, "BUILDKITE_BIN_PATH")
	require.NotNil(t, binPath)
	if _, ok := volumes[podcontract.SupervisorImageVolume]; !ok {
		assert.Equal(t, podcontract.InstallContainer, pod.Spec.InitContainers[0].Name)
		assert.Equal(t, podcontract.AgentInstallContainer, pod.Spec.InitContainers[1].Name)
		assert.Equal(t, []string{podcontract.SupervisorPath, "--" + podcontract.FinishFlushedFlag}, c.Command)
		assert.Equal(t, podcontract.BinDir, binPath.Value)
		assert.NotNil(t, volumes[podcontract.BinVolume].EmptyDir)
		assert.NotContains(t, volumes, podcontract.AgentImageVolume)
		return 2
	}
	// Image volumes: nothing copied, so no init container of the operator's, and each
	// image's folder of programs mounted read-only where the job container looks.
	for _, ic := range pod.Spec.InitContainers {
		assert.NotContains(t, []string{podcontract.InstallContainer, podcontract.AgentInstallContainer}, ic.Name)
	}
	assert.NotContains(t, volumes, podcontract.BinVolume)
	assert.Equal(t, []string{podcontract.SupervisorImageDir + "/agentd-supervise", "--" + podcontract.FinishFlushedFlag}, c.Command)
	assert.Equal(t, podcontract.AgentImageDir, binPath.Value)
	for volume, dir := range map[string]string{podcontract.SupervisorImageVolume: podcontract.SupervisorImageDir, podcontract.AgentImageVolume: podcontract.AgentImageDir} {
		require.NotNil(t, volumes[volume].Image, "volume %s", volume)
		assert.NotEmpty(t, volumes[volume].Image.Reference, "volume %s", volume)
		assert.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: dir, SubPath: podcontract.ImageBinDir, ReadOnly: true})
	}
	assert.Equal(t, podcontract.ImageSupervisorPath, "/"+podcontract.ImageBinDir+"/agentd-supervise", "the supervisor is not in the operator image's folder of programs")
	assert.Equal(t, podcontract.AgentImageBinaryPath, "/"+podcontract.ImageBinDir+"/buildkite-agent", "buildkite-agent is not in the agent image's folder of programs")
	return 0
}

// assertMadeByHand checks the pod of a BuildJob made by hand: it runs without Buildkite,
// and nothing in it refers to the Secret its maker named as the token Secret (anyone may
// name any Secret there), so the kubelet reads nothing from it.
func assertMadeByHand(t *testing.T, job *bkv1.BuildJob, pod *corev1.Pod) {
	t.Helper()
	vars := pod.Spec.Containers[0].Env
	assert.Equal(t, &corev1.EnvVar{Name: podcontract.EnvLocal, Value: "true"}, envVar(vars, podcontract.EnvLocal))
	assert.Nil(t, envVar(vars, podcontract.EnvAccessToken), "a BuildJob made by hand is given no job token")
	assert.Nil(t, envVar(vars, podcontract.EnvEndpoint), "a BuildJob made by hand talks to no Buildkite")
	b, err := json.Marshal(pod)
	require.NoError(t, err)
	assert.False(t, strings.Contains(string(b), job.Spec.TokenSecretRef.Name), "the pod of a BuildJob made by hand refers to its token Secret %q", job.Spec.TokenSecretRef.Name)
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				assert.NotEqual(t, job.Spec.TokenSecretRef.Name, e.ValueFrom.SecretKeyRef.Name, "env %s of container %s", e.Name, c.Name)
			}
		}
	}
}

// TestMadeByHand checks that only a BuildJob the spawner made (with the intake
// annotation) gets the job token, its env from the token Secret and the agent endpoint,
// and that one made by hand gets the local flag instead and nothing from the Secret.
func TestMadeByHand(t *testing.T) {
	opts := Options{AgentEndpoint: "https://agent.buildkite.com/v3"}
	cases := []struct {
		name   string
		change func(job *bkv1.BuildJob)
		// handMade: the pod must run without Buildkite.
		handMade bool
		// want are env values of the job container; "<secret>" for a value from the token
		// Secret, "<unset>" for none.
		want map[string]string
	}{
		{
			name:   "from the spawner: token, endpoint and env from the Secret",
			change: func(job *bkv1.BuildJob) { job.Spec.EnvNames = []string{"DB_PASSWORD"} },
			want: map[string]string{
				podcontract.EnvAccessToken: "<secret>", "DB_PASSWORD": "<secret>",
				podcontract.EnvEndpoint: "https://agent.buildkite.com/v3", podcontract.EnvLocal: "<unset>",
			},
		},
		{
			name: "from the spawner: a step cannot turn Buildkite off",
			change: func(job *bkv1.BuildJob) {
				job.Spec.Env[podcontract.EnvLocal] = "true"
				job.Spec.EnvNames = []string{podcontract.EnvLocal}
			},
			want: map[string]string{podcontract.EnvAccessToken: "<secret>", podcontract.EnvLocal: "<unset>"},
		},
		{
			name:     "by hand: no token, no endpoint, the local flag",
			change:   handMade,
			handMade: true,
			want: map[string]string{
				podcontract.EnvLocal: "true", podcontract.EnvAccessToken: "<unset>", podcontract.EnvEndpoint: "<unset>",
				"CI": "true", podcontract.EnvJobID: jobID, podcontract.EnvCommand: gen.DefaultCommand,
			},
		},
		{
			name: "by hand: env names, a key and an endpoint are ignored",
			change: func(job *bkv1.BuildJob) {
				handMade(job)
				job.Spec.EnvNames = []string{"DB_PASSWORD", "BUILDKITE_GIT_CLONE_FLAGS"}
				job.Spec.TokenSecretRef.Key = "other-key"
				job.Spec.AgentEndpoint = "https://elsewhere.example.com/v3"
			},
			handMade: true,
			want: map[string]string{
				"DB_PASSWORD": "<unset>", podcontract.EnvReplacedPrefix + "BUILDKITE_GIT_CLONE_FLAGS": "<unset>",
				podcontract.EnvEndpoint: "<unset>", podcontract.EnvJobEnvNames: "BUILDKITE_BRANCH,BUILDKITE_JOB_ID,CI",
			},
		},
		{
			name: "by hand: an intake annotation with no value is none",
			change: func(job *bkv1.BuildJob) {
				job.Annotations[bkv1.AnnotationIntake] = ""
			},
			handMade: true,
			want:     map[string]string{podcontract.EnvAccessToken: "<unset>", podcontract.EnvLocal: "true"},
		},
		{
			name: "by hand: its own env cannot put it on Buildkite",
			change: func(job *bkv1.BuildJob) {
				handMade(job)
				job.Spec.Env[podcontract.EnvLocal] = "false"
				job.Spec.Env[podcontract.EnvEndpoint] = "https://agent.buildkite.com/v3"
			},
			handMade: true,
			want:     map[string]string{podcontract.EnvLocal: "true", podcontract.EnvEndpoint: "<unset>"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, env := baseJob(), baseEnv()
			job.Spec.TokenSecretRef.Name = "secret-named-by-its-maker"
			tc.change(job)
			assert.Equal(t, tc.handMade, bkv1.MadeByHand(job))
			pod, err := Build(job, env, opts)
			require.NoError(t, err)
			vars := pod.Spec.Containers[0].Env
			for name, want := range tc.want {
				got := envVar(vars, name)
				switch want {
				case "<unset>":
					assert.Nil(t, got, "env %s", name)
				case "<secret>":
					if assert.NotNil(t, got, "env %s", name) && assert.NotNil(t, got.ValueFrom, "env %s", name) {
						assert.Equal(t, job.Spec.TokenSecretRef.Name, got.ValueFrom.SecretKeyRef.Name, "env %s", name)
					}
				default:
					if assert.NotNil(t, got, "env %s", name) {
						assert.Equal(t, corev1.EnvVar{Name: name, Value: want}, *got)
					}
				}
			}
			checkInvariants(t, job, env, pod)
		})
	}
}

func envVar(vars []corev1.EnvVar, name string) *corev1.EnvVar {
	for i := range vars {
		if vars[i].Name == name {
			return &vars[i]
		}
	}
	return nil
}

func TestOperatorEnvWinsOverJobAndEnvironment(t *testing.T) {
	job, env := baseJob(), baseEnv()
	job.Spec.Env["BUILDKITE_AGENT_ENDPOINT"] = "https://evil.example.com/v3"
	job.Spec.Env["BUILDKITE_COMMAND"] = "rm -rf /"
	env.Spec.Env = []corev1.EnvVar{{Name: "CI", Value: "from-environment"}, {Name: podcontract.EnvPodMarker, Value: "false"}}
	pod, err := Build(job, env, Options{AgentEndpoint: "https://agent.buildkite.com/v3"})
	require.NoError(t, err)
	vars := pod.Spec.Containers[0].Env
	assert.Equal(t, "https://agent.buildkite.com/v3", envVar(vars, podcontract.EnvEndpoint).Value)
	assert.Equal(t, "make test", envVar(vars, podcontract.EnvCommand).Value)
	assert.Equal(t, "from-environment", envVar(vars, "CI").Value, "the environment's env overrides the job's")
	assert.Equal(t, job.Namespace+"/"+job.Name, envVar(vars, podcontract.EnvPodMarker).Value)
}

// TestJobEnvFromSecret checks that the variables a BuildJob lists in spec.envNames reach
// the job container from the token Secret, with no value in the pod spec, and keep their
// place among the job's plain env, the environment's env and the operator's own.
func TestJobEnvFromSecret(t *testing.T) {
	fromSecret := func(job *bkv1.BuildJob, name string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: job.Spec.TokenSecretRef.Name},
			Key:                  bkv1.EnvSecretKey(name),
		}}}
	}
	cases := []struct {
		name     string
		env      map[string]string
		names    []string
		envOfEnv []corev1.EnvVar
		// want maps a variable to its value, or to "<secret>" for one from the Secret.
		want map[string]string
	}{{
		name:  "names only",
		names: []string{"DB_PASSWORD", "FOO"},
		want:  map[string]string{"DB_PASSWORD": "<secret>", "FOO": "<secret>"},
	}, {
		name:  "a name in env and envNames takes the Secret's value",
		env:   map[string]string{"FOO": "plain", "CI": "true"},
		names: []string{"FOO"},
		want:  map[string]string{"FOO": "<secret>", "CI": "true"},
	}, {
		name:     "the environment's env overrides the job's",
		names:    []string{"FOO", "DB_PASSWORD"},
		envOfEnv: []corev1.EnvVar{{Name: "FOO", Value: "from-environment"}},
		want:     map[string]string{"FOO": "from-environment", "DB_PASSWORD": "<secret>"},
	}, {
		name:  "the operator's env overrides the job's",
		names: []string{podcontract.EnvCommand, podcontract.EnvEndpoint},
		want:  map[string]string{podcontract.EnvCommand: "make test", podcontract.EnvEndpoint: "https://agent.buildkite.com/v3"},
	}, {
		name:  "a name no Secret key may be",
		names: []string{"odd name"},
		want:  map[string]string{"odd name": "<secret>"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, env := baseJob(), baseEnv()
			job.Spec.Env, job.Spec.EnvNames, env.Spec.Env = tc.env, tc.names, tc.envOfEnv
			pod, err := Build(job, env, Options{AgentEndpoint: "https://agent.buildkite.com/v3"})
			require.NoError(t, err)
			vars := pod.Spec.Containers[0].Env
			for name, want := range tc.want {
				got := envVar(vars, name)
				require.NotNil(t, got, "env %s", name)
				if want == "<secret>" {
					assert.Equal(t, fromSecret(job, name), *got)
				} else {
					assert.Equal(t, corev1.EnvVar{Name: name, Value: want}, *got)
				}
			}
			checkInvariants(t, job, env, pod)
		})
	}
}

func TestSignalGraceAndDeadline(t *testing.T) {
	cases := []struct {
		name         string
		grace        *int64
		jobTimeout   *int32
		envTimeout   *int32
		wantGrace    string
		wantDeadline *int64
	}{
		{"kubernetes default grace, no timeout", nil, nil, nil, "25", nil},
		{"short grace keeps at least a second", ptr(int64(2)), nil, nil, "1", nil},
		{"job timeout", ptr(int64(60)), ptr(int32(5)), ptr(int32(60)), "55", ptr(int64(5*60 + 600))},
		{"environment default timeout", nil, nil, ptr(int32(60)), "25", ptr(int64(60*60 + 600))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, env := baseJob(), baseEnv()
			env.Spec.TerminationGracePeriodSeconds = tc.grace
			job.Spec.TimeoutMinutes = tc.jobTimeout
			env.Spec.Timeouts.DefaultMinutes = tc.envTimeout
			pod, err := Build(job, env, Options{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantGrace, envVar(pod.Spec.Containers[0].Env, podcontract.EnvSignalGrace).Value)
			assert.Equal(t, tc.wantDeadline, pod.Spec.ActiveDeadlineSeconds)
			assert.Equal(t, DefaultOperatorImage, pod.Spec.InitContainers[0].Image)
		})
	}
}

// TestAgentSettings checks what the job's env says of the agent: the agent's defaults, the
// environment's spec.agent, and who wins where a step or the environment's env sets the
// same variable.
func TestAgentSettings(t *testing.T) {
	cases := []struct {
		name     string
		agent    bkv1.AgentSettings
		jobEnv   map[string]string
		envNames []string
		envOfEnv []corev1.EnvVar
		want     map[string]string
		// absent are variables the pod must not set.
		absent []string
		// replaced are the job's own values of what the agent's settings replace, for the
		// env file.
		replaced []corev1.EnvVar
	}{{
		name: "the agent's defaults",
		want: map[string]string{
			"BUILDKITE_BIN_PATH":          podcontract.BinDir,
			"BUILDKITE_BUILD_PATH":        "/workspace/build",
			"BUILDKITE_HOOKS_PATH":        podcontract.HooksDir,
			"BUILDKITE_PLUGINS_PATH":      "/workspace/.buildkite-agent/plugins",
			"BUILDKITE_SOCKETS_PATH":      "/workspace/.buildkite-agent/sockets",
			"BUILDKITE_PLUGINS_ENABLED":   "true",
			"BUILDKITE_PLUGIN_VALIDATION": "false",
			"BUILDKITE_GIT_CLONE_FLAGS":   "-v",
			"BUILDKITE_GIT_FETCH_FLAGS":   "-v --prune",
			"BUILDKITE_GIT_MIRRORS_PATH":  "",
			"BUILDKITE_REDACTED_VARS":     strings.Join(redact.DefaultPatterns, ","),
			podcontract.EnvJobEnvNames:    "BUILDKITE_BRANCH,BUILDKITE_JOB_ID,CI",
		},
		absent: []string{"BUILDKITE_IGNORED_ENV", "BUILDKITE_SHELL", "BUILDKITE_AGENT_PID", "BUILDKITE_ENV_FILE"},
	}, {
		name: "the environment's settings",
		agent: bkv1.AgentSettings{Plugins: bkv1.PluginsDisabled, GitCloneFlags: "--depth=1", GitFetchFlags: "--depth=1",
			GitMirrorsVolume: "mirrors", RedactedVars: []string{"*_CREDENTIALS", "*_PASSWORD"}},
		want: map[string]string{
			"BUILDKITE_PLUGINS_ENABLED":  "false",
			"BUILDKITE_GIT_CLONE_FLAGS":  "--depth=1",
			"BUILDKITE_GIT_FETCH_FLAGS":  "--depth=1",
			"BUILDKITE_GIT_MIRRORS_PATH": podcontract.GitMirrorsDir,
			"BUILDKITE_REDACTED_VARS":    strings.Join(redact.DefaultPatterns, ",") + ",*_CREDENTIALS",
		},
	}, {
		name:   "a step's agent settings are ignored and named",
		jobEnv: map[string]string{"BUILDKITE_GIT_CLONE_FLAGS": "--mirror", "BUILDKITE_SHELL": "/bin/zsh", "CI": "true"},
		// From the Secret, as the spawner makes BuildJobs.
		envNames: []string{"BUILDKITE_HOOKS_PATH"},
		want: map[string]string{
			"BUILDKITE_GIT_CLONE_FLAGS": "-v",
			"BUILDKITE_HOOKS_PATH":      podcontract.HooksDir,
			// In the order the agent sets them (protectedEnv).
			"BUILDKITE_IGNORED_ENV":    "BUILDKITE_HOOKS_PATH,BUILDKITE_GIT_CLONE_FLAGS,BUILDKITE_SHELL",
			podcontract.EnvJobEnvNames: "BUILDKITE_GIT_CLONE_FLAGS,BUILDKITE_HOOKS_PATH,BUILDKITE_SHELL,CI",
		},
		// The supervisor chooses the shell, as the agent's configuration would.
		absent: []string{"BUILDKITE_SHELL"},
		replaced: []corev1.EnvVar{
			{Name: podcontract.EnvReplacedPrefix + "BUILDKITE_GIT_CLONE_FLAGS", Value: "--mirror"},
			{Name: podcontract.EnvReplacedPrefix + "BUILDKITE_SHELL", Value: "/bin/zsh"},
			{Name: podcontract.EnvReplacedPrefix + "BUILDKITE_HOOKS_PATH", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: baseJob().Spec.TokenSecretRef.Name}, Key: bkv1.EnvSecretKey("BUILDKITE_HOOKS_PATH"),
			}}},
		},
	}, {
		name:     "the environment's env is agent configuration: it wins over the settings",
		envOfEnv: []corev1.EnvVar{{Name: "BUILDKITE_GIT_MIRRORS_PATH", Value: "/cache/git"}, {Name: "BUILDKITE_GIT_CHECKOUT_FLAGS", Value: "-f -q"}},
		want:     map[string]string{"BUILDKITE_GIT_MIRRORS_PATH": "/cache/git", "BUILDKITE_GIT_CHECKOUT_FLAGS": "-f -q"},
	}, {
		name:   "a step may turn plugin validation on",
		jobEnv: map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"},
		want:   map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"},
	}, {
		name:     "validation asked by the environment wins over the step",
		agent:    bkv1.AgentSettings{Plugins: bkv1.PluginsValidated},
		jobEnv:   map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "false"},
		want:     map[string]string{"BUILDKITE_PLUGIN_VALIDATION": "true"},
		replaced: []corev1.EnvVar{{Name: podcontract.EnvReplacedPrefix + "BUILDKITE_PLUGIN_VALIDATION", Value: "false"}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, env := baseJob(), baseEnv()
			if tc.jobEnv != nil || tc.envNames != nil {
				job.Spec.Env, job.Spec.EnvNames = tc.jobEnv, tc.envNames
			}
			env.Spec.Agent, env.Spec.Env = tc.agent, tc.envOfEnv
			env.Spec.Volumes = []corev1.Volume{{Name: "mirrors", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			pod, err := Build(job, env, Options{})
			require.NoError(t, err)
			vars := pod.Spec.Containers[0].Env
			for name, want := range tc.want {
				got := envVar(vars, name)
				require.NotNil(t, got, "env %s", name)
				assert.Equal(t, corev1.EnvVar{Name: name, Value: want}, *got)
			}
			for _, name := range tc.absent {
				assert.Nil(t, envVar(vars, name), "env %s", name)
			}
			var replaced []corev1.EnvVar
			for _, v := range vars {
				if strings.HasPrefix(v.Name, podcontract.EnvReplacedPrefix) {
					replaced = append(replaced, v)
				}
			}
			assert.Equal(t, tc.replaced, replaced)
			checkInvariants(t, job, env, pod)
		})
	}
}

func TestCancelGracePeriod(t *testing.T) {
	cases := []struct {
		name            string
		termination     *int64
		cancel          *int32
		wantSignalGrace string
		wantTermination int64
	}{
		{name: "neither: the pod's default less the margin", wantSignalGrace: "25", wantTermination: 30},
		{name: "a short cancel grace keeps the pod's default", cancel: ptr(int32(10)), wantSignalGrace: "10", wantTermination: 30},
		{name: "a long cancel grace lengthens the pod's", cancel: ptr(int32(120)), wantSignalGrace: "120", wantTermination: 125},
		{name: "both, as the webhook allows", termination: ptr(int64(60)), cancel: ptr(int32(50)), wantSignalGrace: "50", wantTermination: 60},
		{name: "both, the pod's too short: SIGKILL from the supervisor first", termination: ptr(int64(10)), cancel: ptr(int32(50)),
			wantSignalGrace: "9", wantTermination: 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, env := baseJob(), baseEnv()
			env.Spec.TerminationGracePeriodSeconds = tc.termination
			env.Spec.Agent.CancelGracePeriodSeconds = tc.cancel
			pod, err := Build(job, env, Options{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantSignalGrace, envVar(pod.Spec.Containers[0].Env, podcontract.EnvSignalGrace).Value)
			assert.Equal(t, tc.wantTermination, *pod.Spec.TerminationGracePeriodSeconds)
		})
	}
}

func TestBuildRefusesWhatCannotRun(t *testing.T) {
	cases := []struct {
		name   string
		change func(env *bkv1.BuildEnvironment)
		want   string
	}{
		{"no image", func(env *bkv1.BuildEnvironment) { env.Spec.Image = "" }, "spec.image"},
		{"sidecar named job", func(env *bkv1.BuildEnvironment) {
			env.Spec.Sidecars = []corev1.Container{{Name: podcontract.JobContainer, Image: "redis"}}
		}, `container named "job"`},
		{"volume named workspace", func(env *bkv1.BuildEnvironment) {
			env.Spec.Volumes = []corev1.Volume{{Name: podcontract.WorkspaceVolume}}
		}, `volume named "workspace"`},
		{"volume named as the hooks volume", func(env *bkv1.BuildEnvironment) {
			env.Spec.Volumes = []corev1.Volume{{Name: podcontract.HooksVolume}}
		}, `volume named "buildkite-hooks"`},
		{"init container named as the agent's install container", func(env *bkv1.BuildEnvironment) {
			env.Spec.InitContainers = []corev1.Container{{Name: podcontract.AgentInstallContainer, Image: "busybox:1.37"}}
		}, `container named "buildkite-agent-install"`},
		{"volume named as the git SSH key's", func(env *bkv1.BuildEnvironment) {
			env.Spec.Volumes = []corev1.Volume{{Name: podcontract.GitSSHVolume}}
		}, `volume named "buildkite-git-ssh"`},
		{"volume named as the git credentials'", func(env *bkv1.BuildEnvironment) {
			env.Spec.Volumes = []corev1.Volume{{Name: podcontract.GitCredentialsVolume}}
		}, `volume named "buildkite-git-credentials"`},
		{"a git Secret not allowed", func(env *bkv1.BuildEnvironment) {
			env.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "deploy-key"}
		}, `spec.git.sshSecret.name: Forbidden: Secret "deploy-key" is not in spec.allow.secrets`},
		{"git mirrors volume that does not exist", func(env *bkv1.BuildEnvironment) {
			env.Spec.Agent.GitMirrorsVolume = "mirrors"
		}, `spec.agent.gitMirrorsVolume names volume "mirrors"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			tc.change(env)
			_, err := Build(baseJob(), env, Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := Build(baseJob(), nil, Options{})
	require.Error(t, err)
}

func TestPodName(t *testing.T) {
	a := gen.BuildJob(strings.Repeat("a", 70) + "-one")
	b := gen.BuildJob(strings.Repeat("a", 70) + "-two")
	assert.Len(t, PodName(a), 63)
	assert.NotEqual(t, PodName(a), PodName(b), "long names that share a prefix must not collide")
	assert.Equal(t, PodName(a), PodName(a))
	assert.Equal(t, jobID, PodName(baseJob()))
}

// A job pod pulls with its environment's pull secrets and the operator's (the install and
// agent init containers pull the operator's images in every environment): the environment's
// first, each Secret once, none when neither names any. Neither input is changed.
func TestImagePullSecrets(t *testing.T) {
	refs := func(names ...string) []corev1.LocalObjectReference {
		var out []corev1.LocalObjectReference
		for _, n := range names {
			out = append(out, corev1.LocalObjectReference{Name: n})
		}
		return out
	}
	cases := []struct {
		name          string
		env, operator []corev1.LocalObjectReference
		want          []corev1.LocalObjectReference
	}{
		{name: "none"},
		{name: "the environment's only", env: refs("ci"), want: refs("ci")},
		{name: "the operator's only", operator: refs("operator", "mirror"), want: refs("operator", "mirror")},
		{name: "both, the environment's first", env: refs("ci"), operator: refs("operator"), want: refs("ci", "operator")},
		{name: "one named by both, once", env: refs("mirror", "ci"), operator: refs("operator", "mirror"), want: refs("mirror", "ci", "operator")},
		{name: "repeats and empty names dropped", env: refs("ci", "", "ci"), operator: refs("operator", "operator"), want: refs("ci", "operator")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv()
			env.Spec.ImagePullSecrets = slices.Clone(tc.env)
			operator := slices.Clone(tc.operator)
			pod, err := Build(baseJob(), env, Options{ImagePullSecrets: operator})
			require.NoError(t, err)
			assert.Equal(t, tc.want, pod.Spec.ImagePullSecrets)
			assert.Equal(t, tc.env, env.Spec.ImagePullSecrets, "the environment changed")
			assert.Equal(t, tc.operator, operator, "the options changed")
		})
	}
}
