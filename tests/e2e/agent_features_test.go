package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/gitrepo"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// The values the agent-feature cases share with their BuildEnvironments.
const (
	pluginsMount = "/srv/plugins"
	// secretValue is what the with-secret environment's Secret holds: the log must never
	// show it.
	secretValue = "correct-horse-battery-staple"
	// stepSecretValue and fetchedSecretValue are Buildkite secrets of the e2e pipeline (in
	// the fake): one a step names in secrets:, one a command reads with `secret get`.
	stepSecretValue    = "step-secret-from-buildkite-1f2e"
	fetchedSecretValue = "fetched-secret-from-buildkite-9a8b"
	// oidcAudience is the audience the OIDC case asks its token for.
	oidcAudience = "https://e2e.buildkite-operator.invalid"
)

// agentFeatureCases are the jobCase entries for TestJobs: what buildkite-agent bootstrap
// does, on real pods, in the default runner. setupAgentFeatures makes what they need.
func agentFeatureCases() []jobCase {
	return []jobCase{
		{
			name: "a plugin from a local git repository runs its environment and command hooks",
			pipeline: `steps:
  - command: echo "the step's own command"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: plugins
    plugins:
      - ` + pluginsMount + `/greeter-buildkite-plugin#main:
          name: e2e
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas:    []string{"greeter environment hook: hello e2e", "greeter command hook: GREETING=hello e2e"},
			logHasNot: []string{"\nthe step's own command"},
		},
		{
			name: "an agent hook from the BuildEnvironment",
			pipeline: `steps:
  - command: echo "the command sees FROM_AGENT_HOOK=$FROM_AGENT_HOOK"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: agent-hooks
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"agent environment hook from the BuildEnvironment", "the command sees FROM_AGENT_HOOK=yes"},
		},
		{
			name: "a secret from a Kubernetes Secret is redacted",
			pipeline: `steps:
  - command: echo "the password is $DEPLOY_PASSWORD"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: with-secret
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas:    []string{"the password is [REDACTED]"},
			logHasNot: []string{secretValue},
		},
		{
			name: "a step's secrets: value reaches the command and is redacted",
			pipeline: `steps:
  - command: echo "the deploy token is $DEPLOY_TOKEN"
    secrets:
      - DEPLOY_TOKEN
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap-git
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas:    []string{"the deploy token is [REDACTED]"},
			logHasNot: []string{stepSecretValue},
		},
		{
			// Today's agent CLI in the pod, against the fake Buildkite as the agent's API
			// defines these calls. The fake, like Buildkite after an upload, does not
			// interpolate the command: the shell sees each $ as written. The value given to
			// the redactor is made at run time, so that the command bootstrap echoes does
			// not hold it.
			name: "buildkite-agent secret get, redactor add, oidc request-token and env set/get/unset",
			pipeline: `steps:
  - command: |
      v="$(buildkite-agent secret get OTHER_SECRET)"
      echo "secret get gave $v"
      d="dynamic-$((6000+1234))-value"
      echo "$d" | buildkite-agent redactor add
      echo "after redactor add: $d"
      tok="$(buildkite-agent oidc request-token --audience ` + oidcAudience + `)"
      echo "oidc token of ${#tok} bytes"
      v="job-api-$((40+2))"
      buildkite-agent env set "E2E_JOB_API=$v"
      echo "env get gave $(buildkite-agent env get E2E_JOB_API)"
      buildkite-agent env unset E2E_JOB_API
      buildkite-agent env get E2E_JOB_API || echo "E2E_JOB_API is gone after env unset"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap-git
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"secret get gave [REDACTED]", "after redactor add: [REDACTED]", "oidc token of ",
				"env get gave job-api-42", "E2E_JOB_API is gone after env unset"},
			logHasNot: []string{fetchedSecretValue, "dynamic-7234-value", "oidc token of 0 bytes"},
			check: func(t *testing.T, e *harness.Env, j fakebuildkite.JobSnapshot) {
				reqs := e.Fake.OIDCTokenRequests(j.ID)
				require.Len(t, reqs, 1, "one OIDC token request")
				assert.Equal(t, oidcAudience, reqs[0].Audience)
			},
		},
		{
			name: "an annotation",
			pipeline: `steps:
  - command: buildkite-agent annotate "annotated on a pod" --style info --context e2e-annotation
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap-git
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			check: func(t *testing.T, e *harness.Env, j fakebuildkite.JobSnapshot) {
				b, ok := e.Fake.Build(j.BuildID)
				require.True(t, ok)
				assert.Contains(t, b.Annotations, fakebuildkite.Annotation{Context: "e2e-annotation", Style: "info", Body: "annotated on a pod"})
			},
		},
		{
			// One step makes an artifact (artifact_paths), sets meta-data, annotates and uploads
			// the next step, which downloads the artifact and reads the meta-data. The fake runs
			// every job at once (no wait steps), so the consumer retries the download until the
			// producer's artifact phase has uploaded it.
			name: "artifact_paths, meta-data and a pipeline upload across steps",
			pipeline: `steps:
  - label: producer
    command: |
      mkdir -p out && echo "artifact made by the producer" > out/greeting.txt
      buildkite-agent meta-data set e2e-color blue
      printf 'steps:\n  - label: consumer\n    command: "n=0; until buildkite-agent artifact download out/greeting.txt .; do n=$((n+1)); [ $n -lt 30 ] || exit 1; sleep 2; done; cat out/greeting.txt; echo color=$(buildkite-agent meta-data get e2e-color)"\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap-git}\n' | buildkite-agent pipeline upload --no-interpolation
    artifact_paths: out/*.txt
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap-git
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"Uploading artifacts"},
			check: func(t *testing.T, e *harness.Env, j fakebuildkite.JobSnapshot) {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				jobs, err := e.WaitBuild(ctx, j.BuildID, 2*time.Second, nil)
				require.NoError(t, err)
				require.Len(t, jobs, 2, "the producer uploaded the consumer:\n%s", harness.Table(jobs))
				consumer := jobs[1]
				log := fakebuildkite.PlainLog(consumer.Log)
				assert.Equal(t, "consumer", consumer.Label)
				assert.Equal(t, "0", consumer.ExitStatus, "consumer's log:\n%s", log)
				assert.Contains(t, log, "\nartifact made by the producer")
				assert.Contains(t, log, "\ncolor=blue")
				b, ok := e.Fake.Build(j.BuildID)
				require.True(t, ok)
				assert.Equal(t, "blue", b.MetaData["e2e-color"])
				arts := e.Fake.Artifacts(j.ID)
				require.Len(t, arts, 1)
				assert.Equal(t, "out/greeting.txt", arts[0].Path)
			},
		},
	}
}

// setupAgentFeatures makes what agentFeatureCases need: the plugin's repository on the host
// and the "plugins" environment that mounts it, the "agent-hooks" environment with its
// hooks ConfigMap, and the "with-secret" environment with its Secret.
func setupAgentFeatures(t *testing.T, e *harness.Env) {
	t.Helper()
	ctx := context.Background()
	plugins := hostDir(t)
	require.NoError(t, gitrepo.GreeterPlugin(filepath.Join(plugins, "greeter-buildkite-plugin")))
	require.NoError(t, harness.GiveToPods(plugins))
	require.NoError(t, e.ApplyEnvironment(ctx, withRepo(hostPathEnvironment("plugins", plugins,
		corev1.VolumeMount{Name: "plugins", MountPath: pluginsMount, ReadOnly: true}))))

	hooks := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-agent-hooks", Namespace: e.JobNamespace},
		Data: map[string]string{
			"environment": "#!/bin/sh\necho \"agent environment hook from the BuildEnvironment\"\nexport FROM_AGENT_HOOK=yes\n",
		},
	}
	require.NoError(t, createOrReplace(ctx, e, hooks))
	require.NoError(t, e.ApplyEnvironment(ctx, withRepo(gen.BuildEnvironment("agent-hooks",
		gen.SetBuildEnvironmentImage(images.JobImage), gen.SetBuildEnvironmentImagePullPolicy(corev1.PullNever),
		func(be *bkv1.BuildEnvironment) { be.Spec.Agent.HooksConfigMap = hooks.Name }))))

	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-deploy-secret", Namespace: e.JobNamespace},
		StringData: map[string]string{"password": secretValue},
	}
	require.NoError(t, createOrReplace(ctx, e, secret))
	require.NoError(t, e.Fake.SetSecret("org", "e2e", "DEPLOY_TOKEN", stepSecretValue))
	require.NoError(t, e.Fake.SetSecret("org", "e2e", "OTHER_SECRET", fetchedSecretValue))
	require.NoError(t, e.ApplyEnvironment(ctx, withRepo(gen.BuildEnvironment("with-secret",
		gen.SetBuildEnvironmentImage(images.JobImage), gen.SetBuildEnvironmentImagePullPolicy(corev1.PullNever),
		func(be *bkv1.BuildEnvironment) {
			be.Spec.Allow.Secrets = []string{secret.Name}
			be.Spec.Env = []corev1.EnvVar{{Name: "DEPLOY_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secret.Name}, Key: "password",
			}}}}
		}))))
}

// withRepo mounts the suite's repository, which buildkite-agent bootstrap checks out.
func withRepo(be *bkv1.BuildEnvironment) *bkv1.BuildEnvironment {
	gen.SetBuildEnvironmentAllowPrivileged(true)(be)
	gen.AddBuildEnvironmentVolume(corev1.Volume{Name: "repo", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: repo.Dir},
	}}, corev1.VolumeMount{Name: "repo", MountPath: repoMount, ReadOnly: true})(be)
	return be
}

// createOrReplace creates obj, or replaces the one of its name (a rerun on a kept node).
func createOrReplace(ctx context.Context, e *harness.Env, obj client.Object) error {
	err := e.Client.Create(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		return e.Client.Update(ctx, obj)
	}
	return err
}
