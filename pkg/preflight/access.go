package preflight

import (
	"fmt"
	"slices"
	"strings"
)

// checkToken reports a token Buildkite refuses or that lacks a scope the checks need;
// stop is true when the checks cannot go on.
func checkToken(cfg Config, a Answers) (f Finding, stop bool) {
	if a.TokenErr != nil {
		return callProblem(cfg, a, a.TokenErr, cfg.Organization, "read the API token's own details"), true
	}
	return checkScopes(a.Token, checkNeeds(cfg))
}

// checkNeeds are the scopes the checks of cfg need, and what for.
func checkNeeds(cfg Config) []Need {
	needs := []Need{{Scope: ScopeReadClusters, For: "lets the start-up check read the clusters and their queues"}}
	if cfg.Organization == "" {
		needs = append(needs, Need{Scope: ScopeReadOrganizations,
			For: "finds the organization when --buildkite-organization is not given (give it, and the token needs only " + ScopeReadClusters + ")"})
	}
	return needs
}

// requiredScopes are the scopes the checks of cfg need.
func requiredScopes(cfg Config) []string {
	return Scopes(checkNeeds(cfg))
}

// checkScopes reports a token that lacks a scope of needs, saying what each of needs is
// for; stop is true when it lacks one.
func checkScopes(tok Token, needs []Need) (f Finding, stop bool) {
	var missing []string
	whys := make([]string, 0, len(needs))
	for _, n := range needs {
		if !slices.Contains(tok.Scopes, n.Scope) {
			missing = append(missing, n.Scope)
		}
		whys = append(whys, n.Scope+" "+n.For)
	}
	if len(missing) == 0 {
		return Finding{}, false
	}
	them := plural(len(missing), "it", "them")
	return Finding{Reason: ReasonTokenScope, Problem: true, Message: fmt.Sprintf(
		"the Buildkite API token lacks the %s %s: %s. Add %s to the token in Buildkite (Personal Settings > API Access Tokens), or give a token that has %s",
		strings.Join(missing, " and "), plural(len(missing), "scope", "scopes"), strings.Join(whys, ", "), them, them)}, true
}

// resolveOrganization returns the organization to look in: the configured one, or the one
// organization the token reaches.
func resolveOrganization(cfg Config, a Answers) (org string, f Finding, ok bool) {
	if cfg.Organization != "" {
		return cfg.Organization, Finding{}, true
	}
	if a.OrganizationsErr != nil {
		return "", callProblem(cfg, a, a.OrganizationsErr, "", "list the organizations the API token reaches"), false
	}
	switch len(a.Organizations) {
	case 1:
		return a.Organizations[0].Slug, Finding{}, true
	case 0:
		return "", Finding{Reason: ReasonOrganizationNotFound, Problem: true, Message: "the Buildkite API token reaches no organization: " +
			"grant it access to the organization agentd registers in (Organization Access of the token), or give --buildkite-organization"}, false
	}
	slugs := make([]string, 0, len(a.Organizations))
	for _, o := range a.Organizations {
		slugs = append(slugs, o.Slug)
	}
	return "", Finding{Reason: ReasonOrganizationNotFound, Problem: true, Message: fmt.Sprintf(
		"the Buildkite API token reaches %d organizations (%s): give --buildkite-organization the slug of the one agentd registers in",
		len(slugs), strings.Join(slugs, ", "))}, false
}
