package fakebuildkite

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBuildJobEnv(t *testing.T) {
	s := startFake(t, Options{})
	yaml := `
env:
  PIPELINE_LEVEL: p
  SHARED: from-pipeline
steps:
  - label: ":go: test"
    key: test
    command: make test
    env:
      SHARED: from-step
      BUILDKITE_JOB_ID: not-allowed
    agents:
      queue: bk-operator
      cluster: gke-prod
    timeout_in_minutes: 15
    plugins:
      - my-org/buildkite-operator#v0.0.1:
          build_environment: x
          log_paths: [a, b]
      - docker#v5.12.0: ~
      - https://example.com/plugins/thing.git#main
      - ./local/plugin
`
	b, err := s.CreateBuild(BuildRequest{
		Pipeline: "my-pipe", Org: "my-org", PipelineYAML: yaml, Repo: "git@github.com:my-org/repo.git",
		Commit: "abc123", Branch: "feature", Message: "Make it so", Env: map[string]string{"BUILD_LEVEL": "b", "SHARED": "from-build"},
	})
	require.NoError(t, err)
	require.Len(t, b.Jobs, 1)
	j, ok := s.Job(b.Jobs[0])
	require.True(t, ok)
	env := j.Env

	want := map[string]string{
		"BUILDKITE":                   "true",
		"CI":                          "true",
		"BUILDKITE_JOB_ID":            j.ID,
		"BUILDKITE_BUILD_ID":          b.ID,
		"BUILDKITE_BUILD_NUMBER":      "1",
		"BUILDKITE_BUILD_URL":         s.URL() + "/my-org/my-pipe/builds/1",
		"BUILDKITE_PIPELINE_SLUG":     "my-pipe",
		"BUILDKITE_ORGANIZATION_SLUG": "my-org",
		"BUILDKITE_PIPELINE_PROVIDER": "github",
		"BUILDKITE_REPO":              "git@github.com:my-org/repo.git",
		"BUILDKITE_COMMIT":            "abc123",
		"BUILDKITE_BRANCH":            "feature",
		"BUILDKITE_MESSAGE":           "Make it so",
		"BUILDKITE_COMMAND":           "make test",
		"BUILDKITE_LABEL":             ":go: test",
		"BUILDKITE_STEP_KEY":          "test",
		"BUILDKITE_STEP_ID":           j.StepID,
		"BUILDKITE_TIMEOUT":           "15",
		"BUILDKITE_PULL_REQUEST":      "false",
		"BUILDKITE_TAG":               "",
		"BUILDKITE_PLUGINS": `[{"github.com/my-org/buildkite-operator-buildkite-plugin#v0.0.1":{"build_environment":"x","log_paths":["a","b"]}},` +
			`{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0":null},` +
			`{"https://example.com/plugins/thing.git#main":null},{"./local/plugin":null}]`,
		"PIPELINE_LEVEL": "p",
		"BUILD_LEVEL":    "b",
		"SHARED":         "from-step",
	}
	for k, v := range want {
		assert.Equal(t, v, env[k], k)
	}
	assert.NotContains(t, env, "BUILDKITE_PARALLEL_JOB")
	assert.NotContains(t, env, "BUILDKITE_AGENT_ID", "agent variables come at accept")
	assert.Equal(t, []string{"cluster=gke-prod", "queue=bk-operator"}, j.AgentQueryRules)
	assert.Equal(t, 15, j.TimeoutMinutes)
	assert.Equal(t, StateScheduled, j.State)

	b2, err := s.CreateBuild(BuildRequest{Pipeline: "my-pipe", Org: "my-org", PipelineYAML: "steps: [{command: x}]"})
	require.NoError(t, err)
	assert.Equal(t, 2, b2.Number, "build numbers count up per pipeline")
	j2, _ := s.Job(b2.Jobs[0])
	assert.Equal(t, "false", j2.Env["BUILDKITE_TIMEOUT"])
	assert.Equal(t, "", j2.Env["BUILDKITE_PLUGINS"])
	assert.Equal(t, "HEAD", j2.Env["BUILDKITE_COMMIT"])
	assert.Equal(t, j.Env["BUILDKITE_PIPELINE_ID"], j2.Env["BUILDKITE_PIPELINE_ID"])
}

func TestBuildSteps(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, jobs []JobSnapshot)
	}{
		{"parallelism", "steps:\n  - command: t\n    parallelism: 3\n", func(t *testing.T, jobs []JobSnapshot) {
			require.Len(t, jobs, 3)
			for i, j := range jobs {
				assert.Equal(t, i, j.ParallelJob)
				assert.Equal(t, []string{"0", "1", "2"}[i], j.Env["BUILDKITE_PARALLEL_JOB"])
				assert.Equal(t, "3", j.Env["BUILDKITE_PARALLEL_JOB_COUNT"])
				assert.Equal(t, jobs[0].StepID, j.StepID, "parallel jobs share a step")
			}
			assert.NotEqual(t, jobs[0].ID, jobs[1].ID)
		}},
		{"commands list, agents list", "steps:\n  - commands: [a, b]\n    agents: [\"queue=x\", \"os=linux\"]\n", func(t *testing.T, jobs []JobSnapshot) {
			require.Len(t, jobs, 1)
			assert.Equal(t, "a\nb", jobs[0].Command)
			assert.Equal(t, []string{"queue=x", "os=linux"}, jobs[0].AgentQueryRules)
		}},
		{"pipeline-level agents", "agents: {queue: top}\nsteps:\n  - command: a\n  - command: b\n    agents: {queue: own}\n", func(t *testing.T, jobs []JobSnapshot) {
			require.Len(t, jobs, 2)
			assert.Equal(t, []string{"queue=top"}, jobs[0].AgentQueryRules)
			assert.Equal(t, []string{"queue=own"}, jobs[1].AgentQueryRules)
		}},
		{"agents without a queue target the default queue", "steps:\n  - command: a\n    agents: {os: linux}\n", func(t *testing.T, jobs []JobSnapshot) {
			assert.Equal(t, []string{"os=linux", "queue=default"}, jobs[0].AgentQueryRules)
		}},
		{"groups, waits and the legacy list form", "- command: a\n- wait\n- group: G\n  key: g\n  steps:\n    - command: b\n", func(t *testing.T, jobs []JobSnapshot) {
			require.Len(t, jobs, 2)
			assert.Equal(t, "G", jobs[1].Env["BUILDKITE_GROUP_LABEL"])
			assert.Equal(t, "g", jobs[1].Env["BUILDKITE_GROUP_KEY"])
			assert.NotEmpty(t, jobs[1].Env["BUILDKITE_GROUP_ID"])
			assert.NotContains(t, jobs[0].Env, "BUILDKITE_GROUP_ID")
		}},
		{"label falls back to the command", "steps:\n  - command: echo hi\n", func(t *testing.T, jobs []JobSnapshot) {
			assert.Equal(t, "echo hi", jobs[0].Env["BUILDKITE_LABEL"])
		}},
		{"artifact paths", "steps:\n  - command: a\n    artifact_paths: [\"out/*\", \"log.txt\"]\n", func(t *testing.T, jobs []JobSnapshot) {
			assert.Equal(t, "out/*;log.txt", jobs[0].Env["BUILDKITE_ARTIFACT_PATHS"])
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, Options{})
			b, err := s.CreateBuild(BuildRequest{PipelineYAML: tt.yaml})
			require.NoError(t, err)
			var jobs []JobSnapshot
			for _, id := range b.Jobs {
				j, _ := s.Job(id)
				jobs = append(jobs, j)
			}
			tt.check(t, jobs)
		})
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name string
		req  BuildRequest
	}{
		{"not YAML", BuildRequest{PipelineYAML: "steps: [\n"}},
		{"no command steps", BuildRequest{PipelineYAML: "steps:\n  - wait\n"}},
		{"bad parallelism", BuildRequest{PipelineYAML: "steps:\n  - command: a\n    parallelism: lots\n"}},
		{"bad agents", BuildRequest{PipelineYAML: "steps:\n  - command: a\n    agents: [\"no-equals\"]\n"}},
		{"bad slug", BuildRequest{PipelineYAML: "steps: [{command: a}]", Pipeline: "Not A Slug"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startFake(t, Options{})
			_, err := s.CreateBuild(tt.req)
			assert.Error(t, err)
			assert.Empty(t, s.Builds(), "a refused build leaves nothing behind")
		})
	}
}
