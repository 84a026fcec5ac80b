package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestBootstrapSecretsAndOIDC runs, as a pod does (the supervisor and its Bootstrap
// runner), a job whose env has BUILDKITE_SECRETS_CONFIG, the JSON the agent's JobRunner
// makes of the step's `secrets:` (agent/job_runner.go): bootstrap fetches each secret with
// the job token before the job's hooks run, puts it in the job's env when the step names a
// variable, and redacts it. The job then uses what reads secrets and tokens at run time,
// through the Job API that bootstrap serves: `secret get`, `oidc request-token` and
// `redactor add`. Every value reaches the job (it writes them to files) and none reaches
// the log the fake received, where each shows as [REDACTED].
func TestBootstrapSecretsAndOIDC(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	out := t.TempDir()
	// No value is in the command itself, which bootstrap prints before it runs it.
	command := fmt.Sprintf(`out=%q
printf %%s "$DEPLOY_KEY" > "$out/env"; echo "env=[$DEPLOY_KEY]"
buildkite-agent secret get api_token > "$out/secret"; echo "secret=[$(cat "$out/secret")]"
buildkite-agent oidc request-token --audience sts.example.invalid > "$out/oidc"; echo "oidc=[$(cat "$out/oidc")]"
later="runtime-$((4700 + 11))"; echo "$later" | buildkite-agent redactor add; echo "added=[$later]"`, out)
	h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
		PipelineYAML: pipeline(command), Repo: repo, Commit: commits["first"], Branch: "main",
	})
	const deployKey, apiToken = "deploy-value-5be1", "api-value-07d2"
	require.NoError(t, h.s.SetSecret("org", "pipeline", "DEPLOY_KEY", deployKey))
	require.NoError(t, h.s.SetSecret("org", "pipeline", "API_TOKEN", apiToken))
	useBootstrap(h, binDir)
	h.env["BUILDKITE_SECRETS_CONFIG"] = `[{"key":"DEPLOY_KEY","environment_variable":"DEPLOY_KEY"}]`
	log := runToPass(t, h)

	files := map[string]string{}
	for _, name := range []string{"env", "secret", "oidc"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err, "the job wrote %s", name)
		files[name] = strings.TrimSpace(string(b))
	}
	assert.Equal(t, deployKey, files["env"], "the step's secret is in the job's env")
	assert.Equal(t, apiToken, files["secret"], "secret get prints the value")
	claims, err := h.s.VerifyOIDCToken(files["oidc"])
	require.NoError(t, err, "oidc request-token prints the fake's token")
	assert.Equal(t, "sts.example.invalid", claims["aud"])
	assert.Equal(t, h.job.ID, claims["job_id"])
	assert.Equal(t, 2, h.s.RequestCount(fakebuildkite.EPSecrets, h.job.ID))

	assert.Contains(t, log, "Secret DEPLOY_KEY added as environment variable DEPLOY_KEY")
	for _, line := range []string{"env=[[REDACTED]]", "secret=[[REDACTED]]", "oidc=[[REDACTED]]", "added=[[REDACTED]]"} {
		assert.Contains(t, log, line)
	}
	for _, value := range []string{deployKey, apiToken, files["oidc"], "runtime-4711"} {
		assert.NotContains(t, log, value)
	}
}
