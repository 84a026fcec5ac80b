package preflight

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Answers are what Buildkite's REST API answered to the questions the checks ask. A call
// that was not made (an earlier answer made it moot) has neither a value nor an error.
type Answers struct {
	// Endpoint is the REST API asked, for messages.
	Endpoint string
	// Token is GET /v2/access-token.
	Token    Token
	TokenErr error
	// Organizations is GET /v2/organizations, asked only when Config.Organization is empty.
	Organizations    []Organization
	OrganizationsErr error
	// Clusters is GET /v2/organizations/{org}/clusters.
	Clusters    []Cluster
	ClustersErr error
	// Queues and QueuesErr are GET .../clusters/{id}/queues, by cluster ID.
	Queues    map[string][]Queue
	QueuesErr map[string]error
}

// Token is what the REST API says of the token it was asked with.
type Token struct {
	Scopes []string
}

// Organization is one organization the token reaches.
type Organization struct {
	Slug, Name string
}

// Cluster is one cluster of the organization.
type Cluster struct {
	ID, Name string
	// WebURL is the cluster's page on Buildkite, where its queues are made.
	WebURL string
}

// Queue is one queue of a cluster.
type Queue struct {
	ID, Key string
	// WebURL is the queue's page on Buildkite, where dispatch is resumed.
	WebURL         string
	DispatchPaused bool
	PausedBy       string
	PausedAt       time.Time
	PausedNote     string
}

// APIError is a REST API call that failed: Buildkite's answer when it gave one (Status and
// Message), else what kept it from answering (Err).
type APIError struct {
	// Call is the method and path, such as "GET v2/organizations/acme/clusters".
	Call    string
	Status  int
	Message string
	Err     error
}

func (e *APIError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s: %v", e.Call, e.Err)
	}
	return fmt.Sprintf("%s: %d %s", e.Call, e.Status, e.answer())
}

func (e *APIError) Unwrap() error { return e.Err }

// answer is Buildkite's message, or the status's text when it gave none.
func (e *APIError) answer() string {
	if e.Message != "" {
		return e.Message
	}
	return http.StatusText(e.Status)
}

// callProblem describes a failed call: what to do about the token when Buildkite refused
// it, else that nothing further could be checked.
func callProblem(cfg Config, a Answers, err error, org, what string) Finding {
	scopes := strings.Join(requiredScopes(cfg), " and ")
	inOrg := "the organization agentd registers in"
	if org != "" {
		inOrg = "organization " + org
	}
	switch StatusOf(err) {
	case http.StatusUnauthorized:
		return Finding{Reason: ReasonTokenRejected, Problem: true, Message: fmt.Sprintf(
			"Buildkite rejected the API token of --buildkite-api-token-file (%v): it is not a valid API access token, or it was revoked or has expired. "+
				"Create one in Buildkite (Personal Settings > API Access Tokens) with the %s %s and access to %s, and put it in that file's Secret",
			err, scopes, plural(len(requiredScopes(cfg)), "scope", "scopes"), inOrg)}
	case http.StatusForbidden:
		return Finding{Reason: ReasonTokenScope, Problem: true, Message: fmt.Sprintf(
			"Buildkite refused to let the API token %s (%v): the token needs the %s %s and access to %s (the token's Organization Access; "+
				"the organization may also allow API access only from some IP addresses)",
			what, err, scopes, plural(len(requiredScopes(cfg)), "scope", "scopes"), inOrg)}
	case http.StatusNotFound:
		if org != "" && cfg.Organization != "" {
			return Finding{Reason: ReasonOrganizationNotFound, Problem: true, Message: fmt.Sprintf(
				"Buildkite has no organization %q that the API token reaches (%v): correct --buildkite-organization (the slug in https://buildkite.com/organizations/<slug>, lower case) "+
					"or grant the token access to it", org, err)}
		}
	}
	return Finding{Reason: ReasonUnavailable, Problem: true, Message: fmt.Sprintf(
		"could not %s through Buildkite's REST API at %s (%v), so it was not checked whether the cluster and queue %q exist and whether dispatch is paused there; "+
			"the check runs once at start-up: restart agentd to run it again", what, a.Endpoint, err, cfg.Queue)}
}
