package jobpolicy_test

import (
	"encoding/json"
	"testing"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
)

func TestAgentEnv(t *testing.T) {
	cases := []struct {
		name string
		// job is the accept response's JSON.
		job  string
		want map[string]string
	}{{
		name: "nothing to add",
		job:  `{"id":"j","step":{"command":"x"}}`,
		want: map[string]string{},
	}, {
		name: "secrets by name",
		job:  `{"id":"j","step":{"command":"x","secrets":["DB_PASSWORD","API_TOKEN"]}}`,
		want: map[string]string{"BUILDKITE_SECRETS_CONFIG": `[{"environment_variable":"DB_PASSWORD","key":"DB_PASSWORD"},{"environment_variable":"API_TOKEN","key":"API_TOKEN"}]`},
	}, {
		name: "secrets into variables of another name",
		job:  `{"id":"j","step":{"command":"x","secrets":{"DATABASE_URL":"prod_db_url"}}}`,
		want: map[string]string{"BUILDKITE_SECRETS_CONFIG": `[{"environment_variable":"DATABASE_URL","key":"prod_db_url"}]`},
	}, {
		name: "cache paths",
		job:  `{"id":"j","step":{"command":"x","cache":{"paths":["node_modules",".cache/go"],"size":"20g"}}}`,
		want: map[string]string{"BUILDKITE_AGENT_CACHE_PATHS": "node_modules,.cache/go"},
	}, {
		name: "the trace context",
		job:  `{"id":"j","step":{"command":"x"},"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"bk=1"}`,
		want: map[string]string{
			"BUILDKITE_TRACING_TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			"BUILDKITE_TRACING_TRACESTATE":  "bk=1",
		},
	}, {
		name: "a trace parent without a trace state",
		job:  `{"id":"j","step":{"command":"x"},"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
		want: map[string]string{"BUILDKITE_TRACING_TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var job api.Job
			require.NoError(t, json.Unmarshal([]byte(tc.job), &job))
			got, err := jobpolicy.AgentEnv(&job)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
