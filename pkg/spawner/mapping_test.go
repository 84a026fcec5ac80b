package spawner

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testJobID = "0190ABCD-1234-4abc-8def-0123456789ab"

func testJob(env map[string]string) *api.Job {
	base := map[string]string{
		"BUILDKITE_PIPELINE_SLUG":      "app",
		"BUILDKITE_BUILD_NUMBER":       "7",
		"BUILDKITE_AGENT_ACCESS_TOKEN": "bkaj_secret",
		"BUILDKITE_COMMAND":            "make",
	}
	for k, v := range env {
		base[k] = v
	}
	return &api.Job{ID: testJobID, Env: base, Token: "bkaj_secret", ChunksMaxSizeBytes: 1024}
}

func TestBuildJobFor(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		reason  IntakeFailure // "" when the mapping succeeds
		wantMsg string
	}{
		{name: "plain", env: nil},
		{name: "plugin options", env: map[string]string{"BUILDKITE_PLUGINS": `[{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0":{"build_environment":"go"}}]`}},
		{name: "bad plugins JSON", env: map[string]string{"BUILDKITE_PLUGINS": `[{`}, reason: IntakeInvalidOptions, wantMsg: "options are invalid"},
		{name: "no pipeline", env: map[string]string{"BUILDKITE_PIPELINE_SLUG": ""}, reason: IntakeInvalidJob, wantMsg: "no BUILDKITE_PIPELINE_SLUG"},
		{name: "bad build number", env: map[string]string{"BUILDKITE_BUILD_NUMBER": "x"}, reason: IntakeInvalidJob, wantMsg: `BUILDKITE_BUILD_NUMBER "x"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bj, err := buildJobFor(testJob(tc.env), "ns", "https://agent.example/v3")
			if tc.reason != "" {
				var ie *intakeError
				require.True(t, errors.As(err, &ie), "error %v", err)
				assert.Equal(t, tc.reason, ie.reason)
				assert.Contains(t, ie.msg, tc.wantMsg)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, strings.ToLower(testJobID), bj.Name)
			assert.Equal(t, strings.ToLower(testJobID), bj.Spec.JobID)
			assert.NotContains(t, bj.Spec.Env, "BUILDKITE_AGENT_ACCESS_TOKEN")
			assert.NotContains(t, bj.Spec.Env, "BUILDKITE_PLUGINS", "the operator's plugin alone is stripped away entirely")
			assert.Equal(t, bj.Name+"-token", bj.Spec.TokenSecretRef.Name)
			assert.Equal(t, "https://agent.example/v3", bj.Spec.AgentEndpoint)
		})
	}
}

// FuzzBuildJobFor feeds arbitrary jobs (as Buildkite's JSON) to the mapping: it must
// never panic, never let a token into the spec, and explain every refusal.
func FuzzBuildJobFor(f *testing.F) {
	seed, _ := json.Marshal(testJob(map[string]string{"BUILDKITE_PLUGINS": `[{"buildkite-operator#v1":{"build_environment":"go","log_paths":["/a"],"resources":{"requests":{"cpu":"1"}}}}]`}))
	f.Add(seed)
	f.Add([]byte(`{"id":"` + testJobID + `","env":{"BUILDKITE_BUILD_NUMBER":"-1"},"step":{"agents":["a"]}}`))
	f.Add([]byte(`{"id":"x","env":null,"step":{"agents":{"queue":1}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var job api.Job
		if json.Unmarshal(raw, &job) != nil {
			return
		}
		bj, err := buildJobFor(&job, "ns", "https://agent.example/v3")
		if err != nil {
			var ie *intakeError
			if !errors.As(err, &ie) || ie.reason == "" || strings.TrimSpace(ie.msg) == "" {
				t.Fatalf("unexplained error %#v", err)
			}
			return
		}
		if _, ok := bj.Spec.Env["BUILDKITE_AGENT_ACCESS_TOKEN"]; ok {
			t.Fatal("the job token reached the spec")
		}
		if bj.Name != strings.ToLower(job.ID) || bj.Spec.BuildNumber < 1 || bj.Spec.PipelineSlug == "" {
			t.Fatalf("bad mapping: %+v", bj.Spec)
		}
	})
}
