package supervisor

import (
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// IntakeLog takes out of env (a process environment, "NAME=value" entries) the text the
// spawner left for the top of the job's log (podcontract.EnvIntakeLog): what the agent that
// accepted the job prints before bootstrap runs, such as that the job's signature was
// verified. It returns the text ("" when there is none) and env without the variable, every
// entry of it, so that neither the job nor its env file ever sees it. env is not changed.
func IntakeLog(env []string) (text string, rest []string) {
	rest = make([]string, 0, len(env))
	prefix := podcontract.EnvIntakeLog + "="
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, prefix); ok {
			text = v // the last one, as a process reads its environment
			continue
		}
		rest = append(rest, kv)
	}
	return text, rest
}

// printIntakeLog writes the intake text into the job's log, before anything else of the
// job's, as the agent writes it before bootstrap's output, and takes the variable out of
// the job's environment.
func (j *job) printIntakeLog() {
	text, env := IntakeLog(j.conf.Env)
	j.conf.Env = env
	if text = strings.TrimRight(text, "\n"); text != "" {
		_ = j.stream.WriteLine(text)
	}
}
