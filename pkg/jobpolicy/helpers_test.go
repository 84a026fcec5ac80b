package jobpolicy_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/buildkite/agent/v3/api"
	"github.com/buildkite/go-pipeline"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy/jobpolicytest"
)

const (
	testRepo  = "git@github.com:acme/app.git"
	testJobID = "0190abcd-1234-4abc-8def-0123456789ab"
)

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "jwks.json")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// makeJob turns the first step of a pipeline into the job Buildkite would send for it:
// the step signed with key (unless nil) as `buildkite-agent pipeline upload` signs it,
// and the job's env made from the pipeline's env, the step's and Buildkite's own. perm is
// the job's matrix permutation, whose values Buildkite interpolates into the command and
// env. The job comes through JSON, as it comes from the agent API.
func makeJob(t *testing.T, yaml string, key jwk.Key, perm pipeline.MatrixPermutation) *api.Job {
	t.Helper()
	p := jobpolicytest.Sign(t, yaml, key, testRepo)
	var pipeEnv map[string]string
	if p.Env != nil {
		pipeEnv = p.Env.ToMap()
	}
	step := p.Steps[0].(*pipeline.CommandStep)
	interp := func(s string) string {
		for dim, v := range perm {
			tok := "{{matrix}}"
			if dim != "" {
				tok = "{{matrix." + dim + "}}"
			}
			s = strings.ReplaceAll(s, tok, v)
		}
		return s
	}
	env := map[string]string{
		"BUILDKITE":               "true",
		"CI":                      "true",
		"BUILDKITE_JOB_ID":        testJobID,
		"BUILDKITE_REPO":          testRepo,
		"BUILDKITE_COMMAND":       interp(step.Command),
		"BUILDKITE_PIPELINE_SLUG": "app",
	}
	maps.Copy(env, pipeEnv)
	for k, v := range step.Env {
		env[k] = interp(v)
	}
	if len(step.Plugins) > 0 {
		b, err := json.Marshal(step.Plugins)
		require.NoError(t, err)
		env["BUILDKITE_PLUGINS"] = string(b)
	}
	wire, err := json.Marshal(map[string]any{"id": testJobID, "env": env, "step": step, "matrix_permutation": perm})
	require.NoError(t, err)
	var job api.Job
	require.NoError(t, json.Unmarshal(wire, &job))
	return &job
}
