package jobpolicy

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/buildkite/agent/v3/api"
)

// AgentEnv is what the agent's JobRunner adds to a job's env from the job itself before it
// runs bootstrap, replacing the job's own values of those names:
//
//   - BUILDKITE_AGENT_CACHE_PATHS, the step's cache paths, comma-separated, when it has any;
//   - BUILDKITE_SECRETS_CONFIG, the step's secrets as JSON, for bootstrap to fetch each
//     secret into its variable and redact it; only when the step has secrets;
//   - BUILDKITE_TRACING_TRACEPARENT and BUILDKITE_TRACING_TRACESTATE, the job's trace
//     context, when Buildkite sent it. Bootstrap joins the trace when its tracing is on and
//     propagates the trace parent (BUILDKITE_TRACING_BACKEND and
//     BUILDKITE_TRACING_PROPAGATE_TRACEPARENT, which an environment's env may set); the
//     agent passes the values only then, the operator, which has no tracing settings of its
//     own, whenever Buildkite sends them.
func AgentEnv(job *api.Job) (map[string]string, error) {
	env := map[string]string{}
	if c := job.Step.Cache; c != nil && len(c.Paths) > 0 {
		env[envCache] = strings.Join(c.Paths, ",")
	}
	if len(job.Step.Secrets) > 0 {
		b, err := json.Marshal(job.Step.Secrets)
		if err != nil {
			return nil, fmt.Errorf("encoding the step's secrets for %s: %w", envSecrets, err)
		}
		env[envSecrets] = string(b)
	}
	if job.TraceParent != "" {
		env[envTrace] = job.TraceParent
	}
	if job.TraceState != "" {
		env[envTraceSt] = job.TraceState
	}
	return env, nil
}
