// Package redact hides secrets in a job's log as buildkite-agent does: the values of
// environment variables whose names match the redacted-vars patterns (BUILDKITE_REDACTED_VARS)
// become [REDACTED].
//
// Which variables count follows the agent (v3.52 to v3.138, internal/redact): a pattern is a
// path.Match glob over the variable's name, compared as written (on Linux the agent does
// not fold case, so *_TOKEN matches GITHUB_TOKEN and not github_token), and values shorter
// than MinLength bytes are left alone so that a *_TOKEN set to "none" does not turn every
// "none" in the log into [REDACTED].
//
// The replacement is streaming: a Writer holds back only the bytes that could still be the
// start of a secret (fewer than the longest secret's length), so memory stays bounded
// whatever the output, and a secret split across two writes is still found.
package redact

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// EnvRedactedVars is the variable that sets the patterns, as for buildkite-agent start and
// bootstrap: comma-separated globs that replace the defaults. Set but empty, it turns
// pattern-based redaction off.
const EnvRedactedVars = "BUILDKITE_REDACTED_VARS"

// MinLength is the shortest value that is redacted, as in the agent.
const MinLength = 6

// Replacement is what a secret becomes in the log.
const Replacement = "[REDACTED]"

// DefaultPatterns are buildkite-agent's default redacted-vars (v3.138; v3.52 had the first
// six without *_SSH_KEY). The job token, BUILDKITE_AGENT_ACCESS_TOKEN, matches *_TOKEN.
var DefaultPatterns = []string{
	"*_PASSWORD",
	"*_SECRET",
	"*_TOKEN",
	"*_PRIVATE_KEY",
	"*_SSH_KEY",
	"*_ACCESS_KEY",
	"*_SECRET_KEY",
	"*_CONNECTION_STRING",
	"*_API_KEY",
}

// PatternsFromEnv returns the patterns in effect for env (as os.Environ returns it, the last
// setting winning): those of BUILDKITE_REDACTED_VARS when it is set, even to nothing, and the
// defaults otherwise. Like the agent's command line, the value is split at commas and each
// pattern trimmed of spaces; empty ones are dropped.
func PatternsFromEnv(env []string) []string {
	v, ok := lookup(env, EnvRedactedVars)
	if !ok {
		return slices.Clone(DefaultPatterns)
	}
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Values returns the values of the variables of env whose names match a pattern, and the
// names of those that matched with a value too short to redact (empty values are not
// reported). A malformed pattern is an error that names it; the others still apply.
func Values(patterns, env []string) (values, short []string, err error) {
	var bad []string
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			bad = append(bad, p)
		}
	}
	seen := map[string]bool{}
	for _, kv := range latest(env) {
		name, value, _ := strings.Cut(kv, "=")
		if !matchAny(patterns, name) {
			continue
		}
		if len(value) < MinLength {
			if value != "" {
				short = append(short, name)
			}
			continue
		}
		if !seen[value] {
			seen[value] = true
			values = append(values, value)
		}
	}
	if len(bad) > 0 {
		err = fmt.Errorf("%s has patterns that are not valid globs: %q", EnvRedactedVars, bad)
	}
	return values, short, err
}

func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, err := path.Match(p, name); err == nil && ok {
			return true
		}
	}
	return false
}

// latest returns env with only the last setting of each name, in order, as exec would see it.
func latest(env []string) []string {
	last := make(map[string]int, len(env))
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		last[name] = i
	}
	out := make([]string, 0, len(last))
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if last[name] == i {
			out = append(out, kv)
		}
	}
	return out
}

func lookup(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}
