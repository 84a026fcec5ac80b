package jobpolicy

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"

	"github.com/buildkite/agent/v3/api"
	"github.com/buildkite/go-pipeline"

	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
)

// allowlists checks the job against the allowlists, as the agent does after the signature:
// the repository it checks out, the names of its env variables, the plugins it runs. It
// returns "" when all allow the job; else the flag of the list that refused it and the line
// the agent prints, which names what was checked and the value it refused.
func (p *Policy) allowlists(job *api.Job) (flag, line string) {
	if repo := job.Env[envRepo]; !matchAny(p.repos, repo) {
		return "--allowed-repositories", refusedLine("repo", redactURL(repo), p.repos)
	}
	if p.envs != nil {
		// In name order, so that the same job is always refused for the same variable.
		for _, name := range slices.Sorted(maps.Keys(job.Env)) {
			if !matchAny(p.envs, name) {
				return "--allowed-environment-variables", refusedLine("environment variables", name, p.envs)
			}
		}
	}
	if len(p.plugins) > 0 {
		if raw := job.Env[envPlugins]; raw != "" {
			var ps pipeline.Plugins
			if err := json.Unmarshal([]byte(raw), &ps); err != nil {
				// What cannot be read cannot be allowed.
				return "--allowed-plugins", fmt.Sprintf("failed to validate plugins: failed to unmarshal plugins for validation: %v\n", err)
			}
			for _, pl := range ps {
				if pl == nil || plugin.IsOperatorSource(pl.Source) {
					// The operator's own plugin holds the job's options for the operator, which
					// takes them out of BUILDKITE_PLUGINS: nothing fetches or runs it.
					continue
				}
				if src := pl.FullSource(); !matchAny(p.plugins, src) {
					return "--allowed-plugins", refusedLine("plugins", redactURL(src), p.plugins)
				}
			}
		}
	}
	return "", ""
}

// refusedLine is the agent's line for a value an allowlist refused: what was checked, the
// value, and the list's expressions.
func refusedLine(what, value string, patterns []*regexp.Regexp) string {
	return fmt.Sprintf("failed to validate %s: %s has no match in %s\n", what, value, patterns)
}

// matchAny reports whether v matches one of patterns; an empty list allows everything.
func matchAny(patterns []*regexp.Regexp, v string) bool {
	if len(patterns) == 0 {
		return true
	}
	return slices.ContainsFunc(patterns, func(re *regexp.Regexp) bool { return re.MatchString(v) })
}

// redactURL hides the password of a URL (a repository or plugin cloned with a credential in
// it) before it goes into a job's log or the operator's.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if hasScheme.MatchString(raw) {
			// Unparsed, the credential could not be found to hide: show none of it.
			return "(invalid URL)"
		}
		return raw
	}
	if u.User == nil {
		return raw
	}
	if _, ok := u.User.Password(); !ok {
		return raw
	}
	return u.Redacted()
}

var hasScheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://`)
