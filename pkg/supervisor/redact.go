package supervisor

import (
	"fmt"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/redact"
)

// redactorFor compiles the secrets of the job, as the agent picks them: the values of the
// variables of its environment whose names match the redacted-vars patterns
// (BUILDKITE_REDACTED_VARS, or the agent's defaults), and always the job token. notes are
// warnings for the log, as bootstrap prints them, about variables that are not redacted.
func redactorFor(conf Config) (r *redact.Redactor, notes []string) {
	values, short, err := redact.Values(redact.PatternsFromEnv(conf.Env), conf.Env)
	if err != nil {
		notes = append(notes, "⚠️ Warning: "+err.Error())
	}
	for _, name := range short {
		notes = append(notes, fmt.Sprintf("⚠️ Warning: the value of %s is shorter than %d bytes and will not be redacted", name, redact.MinLength))
	}
	return redact.New(append(values, conf.Token)...), notes
}

// withRedactedVars gives bootstrap the redacted-vars patterns that buildkite-agent start
// gives its jobs, the agent's defaults, unless the environment sets its own (even none):
// bootstrap then redacts the secrets that its hooks and plugins export, which the
// supervisor never sees.
func withRedactedVars(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, redact.EnvRedactedVars+"=") {
			return env
		}
	}
	return append(env, redact.EnvRedactedVars+"="+strings.Join(redact.DefaultPatterns, ","))
}
