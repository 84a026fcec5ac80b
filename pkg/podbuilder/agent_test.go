package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// TestAgentSettingsOfV3138 checks what the agent's job env came to be in v3.138 with its
// defaults (JobRunner.createEnvironment): what a step's env may still set itself (the
// sparse checkout, Buildkite's remote mirror, git's submodules, which the agent no longer
// sets unless its configuration turns them off), and what it may not, named in the agent's
// order. TestEnvParity in pkg/supervisor holds the whole to the real agent.
func TestAgentSettingsOfV3138(t *testing.T) {
	const unset = "<unset>"
	cases := []struct {
		name   string
		jobEnv map[string]string
		want   map[string]string // the pod's value of each; unset for none
	}{{
		name: "the agent's own values when the step sets none",
		want: map[string]string{
			"BUILDKITE_GIT_SPARSE_CHECKOUT_PATHS": "",
			"BUILDKITE_GIT_SPARSE_CHECKOUT_MODE":  "cone",
			"BUILDKITE_GIT_REMOTE_MIRROR_URL":     "",
			"BUILDKITE_CHECKOUT_OVERRIDE_MODE":    "from-job",
			"BUILDKITE_CHECKOUT_ATTEMPTS":         "6",
			"BUILDKITE_GIT_MIRROR_CHECKOUT_MODE":  "reference",
			"BUILDKITE_TRACE_CONTEXT_ENCODING":    "gob",
			"BUILDKITE_NO_HTTP2":                  "false",
			"BUILDKITE_JOB_LOGS_OTLP":             "false",
			"BUILDKITE_GIT_SUBMODULES":            unset,
			"BUILDKITE_IGNORED_ENV":               unset,
		},
	}, {
		name: "a step's sparse checkout, remote mirror and submodules are its own",
		jobEnv: map[string]string{
			"BUILDKITE_GIT_SPARSE_CHECKOUT_PATHS": "docs,src",
			"BUILDKITE_GIT_SPARSE_CHECKOUT_MODE":  "no-cone",
			"BUILDKITE_GIT_REMOTE_MIRROR_URL":     "https://mirror.example.invalid/repo.git",
			"BUILDKITE_GIT_SUBMODULES":            "false",
		},
		want: map[string]string{
			"BUILDKITE_GIT_SPARSE_CHECKOUT_PATHS": "docs,src",
			"BUILDKITE_GIT_SPARSE_CHECKOUT_MODE":  "no-cone",
			"BUILDKITE_GIT_REMOTE_MIRROR_URL":     "https://mirror.example.invalid/repo.git",
			"BUILDKITE_GIT_SUBMODULES":            "false",
			"BUILDKITE_IGNORED_ENV":               unset,
		},
	}, {
		name: "what the agent sets over a step's env is ignored, in the agent's order",
		jobEnv: map[string]string{
			"BUILDKITE_TRACE_CONTEXT_ENCODING":  "json",
			"BUILDKITE_CHECKOUT_ATTEMPTS":       "1",
			"BUILDKITE_GIT_COMMIT_VERIFICATION": "strict",
			"BUILDKITE_NO_HTTP2":                "true",
		},
		want: map[string]string{
			"BUILDKITE_TRACE_CONTEXT_ENCODING":  "gob",
			"BUILDKITE_CHECKOUT_ATTEMPTS":       "6",
			"BUILDKITE_GIT_COMMIT_VERIFICATION": "",
			"BUILDKITE_NO_HTTP2":                "false",
			"BUILDKITE_IGNORED_ENV":             "BUILDKITE_NO_HTTP2,BUILDKITE_CHECKOUT_ATTEMPTS,BUILDKITE_GIT_COMMIT_VERIFICATION,BUILDKITE_TRACE_CONTEXT_ENCODING",
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job, env := baseJob(), baseEnv()
			if tc.jobEnv != nil {
				job.Spec.Env = tc.jobEnv
			}
			pod, err := Build(job, env, Options{})
			require.NoError(t, err)
			vars := pod.Spec.Containers[0].Env
			for name, want := range tc.want {
				got := envVar(vars, name)
				if want == unset {
					assert.Nil(t, got, "env %s", name)
					continue
				}
				require.NotNil(t, got, "env %s", name)
				assert.Equal(t, corev1.EnvVar{Name: name, Value: want}, *got)
			}
			checkInvariants(t, job, env, pod)
		})
	}
}
