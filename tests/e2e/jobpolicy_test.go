package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy/jobpolicytest"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// policyJWKSSecret holds the public key set the operator verifies signed jobs with.
const policyJWKSSecret = "e2e-pipeline-verification"

// TestJobPolicy installs the operator, through its chart, with what `buildkite-agent start`
// checks before a job runs: a verification key set (block, then warn) and the three
// allowlists. Jobs it refuses end with the agent's signal reason and its explanation, and
// get no BuildJob and no pod; the others run on real pods. The release goes back to the
// suite's values at the end.
func TestJobPolicy(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "the operator runs in the cluster, installed by its chart")
	ctx := context.Background()

	trusted, stranger := jobpolicytest.NewKey(t, "e2e-trusted"), jobpolicytest.NewKey(t, "e2e-stranger")
	require.NoError(t, createOrReplace(ctx, e, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: policyJWKSSecret, Namespace: e.Namespace},
		Data:       map[string][]byte{"jwks.json": jobpolicytest.KeySet(t, trusted)},
	}))

	// The step every signed case starts from: it checks out the suite's repository, in an
	// environment that mounts it, so that the repository allowlist has a repository to allow.
	const step = `steps:
  - command: echo "the signed step ran with GREETING=$GREETING"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: git
      GREETING: hello
`
	signed := signPipeline(t, step, trusted)
	// Tampered after signing, as someone who can edit a job but not sign it would.
	tampered := strings.Replace(signed, "the signed step ran", "a tampered step ran", 1)
	require.NotEqual(t, signed, tampered)
	unknownKey := signPipeline(t, step, stranger)
	unsigned := signPipeline(t, step, nil)

	block := policyValues(t, "block")
	t0 := time.Now()
	require.NoError(t, e.Release.Upgrade(ctx, "-f", block))
	require.NoError(t, e.WaitAgents(ctx, spawn, 2*time.Minute))
	recordTiming("job policy: helm upgrade to a key set and allowlists rolled out in %s", time.Since(t0).Round(10*time.Millisecond))
	t.Cleanup(func() {
		// Back to the suite's values for the tests that follow.
		require.NoError(t, e.Release.Upgrade(context.Background()))
		require.NoError(t, e.WaitAgents(context.Background(), spawn, 2*time.Minute))
	})

	refused := func(reason string, logHas ...string) jobCase {
		return jobCase{
			rawPipeline: true, repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "-1", signalReason: reason,
			logHas: logHas,
			check:  noBuildJob,
		}
	}
	cases := []jobCase{
		{
			name:        "a signed step runs, its log saying it was verified",
			pipeline:    signed,
			rawPipeline: true, repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"Job signature verified", "the signed step ran with GREETING=hello"},
		},
		withName(refused("signature_rejected", "signature verification failed"), "a tampered step is refused", tampered),
		withName(refused("signature_rejected", "signature verification failed"), "an unsigned step is refused", unsigned),
		withName(refused("signature_rejected", "signature verification failed"), "a step signed with an unknown key is refused", unknownKey),
		withName(refused("agent_refused", "failed to validate plugins", "forbidden-buildkite-plugin"), "a plugin the allowlist does not name is refused",
			signPipeline(t, `steps:
  - command: echo "never runs"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: git
    plugins:
      - some-org/forbidden#v1.0.0: {}
`, trusted)),
		withName(refused("agent_refused", "failed to validate environment variables", "SNEAKY"), "an env variable the allowlist does not name is refused",
			signPipeline(t, `steps:
  - command: echo "never runs"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: git
      SNEAKY: "1"
`, trusted)),
	}
	// A repository the allowlist does not name: the build's, so it is signed for it.
	otherRepo := refused("agent_refused", "failed to validate repo", "git@example.invalid:acme/other.git")
	otherRepo.name, otherRepo.repo = "a repository the allowlist does not name is refused", "git@example.invalid:acme/other.git"
	otherRepo.pipeline = signPipelineFor(t, step, trusted, otherRepo.repo)
	cases = append(cases, otherRepo)
	t.Run("block", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				runCase(t, e, tc)
			})
		}
	})

	warn := policyValues(t, "warn")
	require.NoError(t, e.Release.Upgrade(ctx, "-f", warn))
	require.NoError(t, e.WaitAgents(ctx, spawn, 2*time.Minute))
	warned := map[string]struct{ pipeline, ran string }{
		"an unsigned step":                  {unsigned, "the signed step ran with GREETING=hello"},
		"a tampered step":                   {tampered, "a tampered step ran with GREETING=hello"},
		"a step signed with an unknown key": {unknownKey, "the signed step ran with GREETING=hello"},
	}
	t.Run("warn", func(t *testing.T) {
		for what, w := range warned {
			t.Run(what+" runs with a warning", func(t *testing.T) {
				t.Parallel()
				runCase(t, e, jobCase{
					pipeline: w.pipeline, rawPipeline: true, repo: repoMount, commit: repo.First,
					state: fakebuildkite.StateFinished, exitStatus: "0",
					logHas: []string{"signature verification failed", w.ran},
				})
			})
		}
	})
}

// withName names a refused case and gives it its pipeline.
func withName(tc jobCase, name, pipeline string) jobCase {
	tc.name, tc.pipeline = name, pipeline
	return tc
}

// noBuildJob checks that a refused job got no BuildJob (and so no token Secret or pod).
func noBuildJob(t *testing.T, e *harness.Env, j fakebuildkite.JobSnapshot) {
	t.Helper()
	var list bkv1.BuildJobList
	require.NoError(t, e.Client.List(context.Background(), &list, client.InNamespace(e.JobNamespace)))
	for _, bj := range list.Items {
		assert.NotEqual(t, j.ID, bj.Spec.JobID, "a refused job got BuildJob %s", bj.Name)
	}
	var pods corev1.PodList
	require.NoError(t, e.Client.List(context.Background(), &pods, client.InNamespace(e.JobNamespace)))
	for _, p := range pods.Items {
		assert.NotContains(t, p.Name, strings.ToLower(j.ID), "a refused job got pod %s", p.Name)
	}
}

// policyValues writes chart values that verify signatures with behaviour and set the
// three allowlists so that the suite's repository, the operator's own plugin and the
// variables the cases use are allowed.
func policyValues(t *testing.T, behavior string) string {
	t.Helper()
	values := map[string]any{"buildkite": map[string]any{"jobPolicy": map[string]any{
		"verification": map[string]any{
			"jwksSecret":      map[string]any{"name": policyJWKSSecret, "key": "jwks.json"},
			"failureBehavior": behavior,
		},
		"allowedRepositories":                []string{"^" + repoMount + "$"},
		"allowedPlugins":                     []string{`^/srv/plugins/`},
		"enableEnvironmentVariableAllowlist": true,
		"allowedEnvironmentVariables":        []string{`^BK_OPERATOR_`, `^GREETING$`},
	}}}
	b, err := json.Marshal(values) // JSON is YAML
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "policy-"+behavior+".yaml")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

// signPipeline signs every step of src for the suite's repository, as `buildkite-agent
// pipeline upload --jwks-file` does, and returns the upload (JSON) with the operator's
// queue; a nil key leaves the steps unsigned.
func signPipeline(t *testing.T, src string, key jwk.Key) string {
	t.Helper()
	return signPipelineFor(t, src, key, repoMount)
}

func signPipelineFor(t *testing.T, src string, key jwk.Key, repoURL string) string {
	t.Helper()
	b, err := json.Marshal(jobpolicytest.Sign(t, "agents:\n  queue: bk-operator\n"+src, key, repoURL))
	require.NoError(t, err)
	return string(b)
}
