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
	var missing []string
	for _, s := range requiredScopes(cfg) {
		if !slices.Contains(a.Token.Scopes, s) {
			missing = append(missing, s)
		}
	}
	if len(missing) == 0 {
		return Finding{}, false
	}
	msg := fmt.Sprintf("the Buildkite API token lacks the %s %s, which the start-up check needs: %s reads the clusters and their queues",
		strings.Join(missing, " and "), plural(len(missing), "scope", "scopes"), ScopeReadClusters)
	if cfg.Organization == "" {
		msg += fmt.Sprintf("; %s finds the organization, as --buildkite-organization is not given (give it, and the token needs only %s)", ScopeReadOrganizations, ScopeReadClusters)
	}
	msg += ". Edit the token in Buildkite (Personal Settings > API Access Tokens) to add " + plural(len(missing), "it", "them") + ", or give a token that has " + plural(len(missing), "it", "them")
	return Finding{Reason: ReasonTokenScope, Problem: true, Message: msg}, true
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
