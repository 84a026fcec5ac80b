// Package preflight checks, once at start-up, that what agentd registers its slots with
// exists on Buildkite: the organization, the cluster and the queue; and that dispatch is
// not paused on that queue. Without these, agentd's slots fail to register, or register
// and never get a job, and nothing in Kubernetes says why.
//
// It asks Buildkite's REST API with an API access token: the agent registration token
// cannot read clusters or queues. Evaluate is the judgement, a pure function of the API's
// answers that returns findings, each fine or a problem saying what to create or resume;
// Runner asks the questions (github.com/buildkite/go-buildkite) and hands the answers to
// Evaluate.
//
// What each call needs of the token (Buildkite's REST API documentation):
//
//	GET /v2/access-token                                     no scope (the token's own scopes)
//	GET /v2/organizations                                    read_organizations
//	GET /v2/organizations/{org}/clusters                     read_clusters
//	GET /v2/organizations/{org}/clusters/{cluster}/queues    read_clusters
//
// The token does not name its organization; an API token is granted to one organization,
// so listing the organizations it reaches finds it when none is configured.
//
// Lookup is the same lookup, with the same calls, judgements and words, for the other
// readers of the REST API (pkg/warmdemand): the organization and the cluster's queue, or
// what to fix. They share the client (NewClient), the paging (Paginate) and the errors of
// a call (APIError) too.
package preflight

// Scopes of an API access token that the checks need.
const (
	// ScopeReadClusters lists clusters and their queues: always needed.
	ScopeReadClusters = "read_clusters"
	// ScopeReadOrganizations lists the organizations the token reaches: needed only to
	// find the organization when Config.Organization is empty.
	ScopeReadOrganizations = "read_organizations"
)

// Reasons of findings, CamelCase as Kubernetes event reasons are.
const (
	// ReasonPassed: every check passed (a finding that is not a problem).
	ReasonPassed = "BuildkitePreflightPassed"
	// ReasonSkipped: there is no API token, so nothing was checked.
	ReasonSkipped = "BuildkitePreflightSkipped"
	// ReasonTokenUnreadable: the API token's file could not be read.
	ReasonTokenUnreadable = "BuildkiteAPITokenUnreadable"
	// ReasonTokenRejected: Buildkite does not take the token (401).
	ReasonTokenRejected = "BuildkiteAPITokenRejected"
	// ReasonTokenScope: the token lacks a scope, or access, that a check needs (403).
	ReasonTokenScope = "BuildkiteAPITokenScope"
	// ReasonOrganizationNotFound: the organization is unknown to the token, or cannot be told.
	ReasonOrganizationNotFound = "BuildkiteOrganizationNotFound"
	// ReasonClusterNotFound: no cluster, or more than one, answers to the configured one.
	ReasonClusterNotFound = "BuildkiteClusterNotFound"
	// ReasonQueueNotFound: the cluster has no queue of agentd's queue key.
	ReasonQueueNotFound = "BuildkiteQueueNotFound"
	// ReasonQueuePaused: dispatch is paused on the queue.
	ReasonQueuePaused = "BuildkiteQueuePaused"
	// ReasonUnavailable: the REST API did not answer, or answered something unexpected.
	ReasonUnavailable = "BuildkiteAPIUnavailable"
)

// Config is what agentd registers with, as its flags say.
type Config struct {
	// Organization is the organization's slug; empty: the one organization the token reaches.
	Organization string
	// Cluster is the cluster's name or UUID; empty: every cluster is searched for Queue.
	Cluster string
	// Queue is the key of the queue every slot registers with (agentd's --queue).
	Queue string
}

// Finding is the outcome of one check.
type Finding struct {
	// Reason names the check's outcome: one of the Reason constants.
	Reason string
	// Problem is true when something must be fixed for agentd to get jobs.
	Problem bool
	// Message says what was found and, for a problem, what to create, resume or change.
	Message string
}

// Evaluate turns the API's answers into findings: the first problem that stops the checks
// (a token Buildkite refuses, an organization or cluster that cannot be found), or one
// finding per cluster searched for the queue.
func Evaluate(cfg Config, a Answers) []Finding {
	if f, stop := checkToken(cfg, a); stop {
		return []Finding{f}
	}
	org, f, ok := resolveOrganization(cfg, a)
	if !ok {
		return []Finding{f}
	}
	if a.ClustersErr != nil {
		return []Finding{callProblem(cfg, a, a.ClustersErr, org, "list the clusters of organization "+org)}
	}
	targets, f, ok := matchClusters(cfg, org, a.Clusters)
	if !ok {
		return []Finding{f}
	}
	return checkQueues(cfg, org, targets, a)
}

// Problems returns the findings that are problems.
func Problems(fs []Finding) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.Problem {
			out = append(out, f)
		}
	}
	return out
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
