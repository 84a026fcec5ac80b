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
package preflight

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

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

// maxClustersSearched bounds how many clusters are searched for the queue when no cluster
// is configured: one call each.
const maxClustersSearched = 20

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

func statusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
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

// requiredScopes are the scopes the checks of cfg need.
func requiredScopes(cfg Config) []string {
	if cfg.Organization == "" {
		return []string{ScopeReadClusters, ScopeReadOrganizations}
	}
	return []string{ScopeReadClusters}
}

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

// matchClusters returns the clusters to look for the queue in: the configured one, or
// every cluster when none is configured.
func matchClusters(cfg Config, org string, clusters []Cluster) (targets []Cluster, f Finding, ok bool) {
	if cfg.Cluster == "" {
		switch {
		case len(clusters) == 0:
			return nil, Finding{Reason: ReasonClusterNotFound, Problem: true, Message: fmt.Sprintf(
				"Buildkite organization %s has no cluster: create one (Agents > Create a Cluster) with a queue %q, "+
					"give agentd an agent token of that cluster, and --buildkite-cluster its name", org, cfg.Queue)}, false
		case len(clusters) > maxClustersSearched:
			return nil, Finding{Reason: ReasonClusterNotFound, Problem: true, Message: fmt.Sprintf(
				"Buildkite organization %s has %d clusters, too many to search each for queue %q: "+
					"give --buildkite-cluster the name or UUID of the cluster whose agent token agentd registers with", org, len(clusters), cfg.Queue)}, false
		}
		return clusters, Finding{}, true
	}
	for _, c := range clusters {
		if strings.EqualFold(c.ID, cfg.Cluster) {
			return []Cluster{c}, Finding{}, true
		}
	}
	byName := filterClusters(clusters, func(c Cluster) bool { return c.Name == cfg.Cluster })
	if len(byName) == 0 {
		// Names are not keys in Buildkite; a difference of case alone is taken as a match.
		byName = filterClusters(clusters, func(c Cluster) bool { return strings.EqualFold(c.Name, cfg.Cluster) })
	}
	switch len(byName) {
	case 1:
		return byName, Finding{}, true
	case 0:
		return nil, Finding{Reason: ReasonClusterNotFound, Problem: true, Message: fmt.Sprintf(
			"Buildkite organization %s has no cluster named %q or of that UUID (%s): create it (Agents > Create a Cluster) with a queue %q "+
				"and give agentd an agent token of that cluster, or correct --buildkite-cluster", org, cfg.Cluster, clusterList(clusters), cfg.Queue)}, false
	}
	ids := make([]string, 0, len(byName))
	for _, c := range byName {
		ids = append(ids, c.ID)
	}
	return nil, Finding{Reason: ReasonClusterNotFound, Problem: true, Message: fmt.Sprintf(
		"%d clusters of Buildkite organization %s are named %q (UUIDs %s): give --buildkite-cluster the UUID of the one whose agent token agentd registers with",
		len(byName), org, cfg.Cluster, strings.Join(ids, ", "))}, false
}

func filterClusters(cs []Cluster, keep func(Cluster) bool) []Cluster {
	var out []Cluster
	for _, c := range cs {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// clusterList names the clusters an organization has, for a message.
func clusterList(cs []Cluster) string {
	if len(cs) == 0 {
		return "it has none"
	}
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, fmt.Sprintf("%q", c.Name))
	}
	return "it has " + strings.Join(names, ", ")
}

// checkQueues looks for the queue in each target cluster: a finding per cluster, or one
// problem when no cluster was named and none has it.
func checkQueues(cfg Config, org string, targets []Cluster, a Answers) []Finding {
	var out []Finding
	var without []Cluster
	found := 0
	for _, c := range targets {
		where := fmt.Sprintf("cluster %q (%s) of Buildkite organization %s", c.Name, c.ID, org)
		if err := a.QueuesErr[c.ID]; err != nil {
			out = append(out, callProblem(cfg, a, err, org, "list the queues of "+where))
			continue
		}
		q, ok := findQueue(a.Queues[c.ID], cfg.Queue)
		if !ok {
			without = append(without, c)
			continue
		}
		found++
		if q.DispatchPaused {
			out = append(out, Finding{Reason: ReasonQueuePaused, Problem: true, Message: pausedMessage(q, where, a.Endpoint, org, c.ID)})
			continue
		}
		msg := fmt.Sprintf("queue %q exists in %s and dispatch to it is not paused", cfg.Queue, where)
		if cfg.Cluster == "" {
			msg += " (found by searching every cluster: give --buildkite-cluster to check only the one whose agent token agentd registers with)"
		}
		out = append(out, Finding{Reason: ReasonPassed, Message: msg})
	}
	if cfg.Cluster != "" {
		for _, c := range without {
			out = append(out, queueMissing(cfg, org, c, a.Queues[c.ID]))
		}
		return out
	}
	if found == 0 && len(without) > 0 {
		out = append(out, Finding{Reason: ReasonQueueNotFound, Problem: true, Message: fmt.Sprintf(
			"no cluster of Buildkite organization %s has a queue %q (%s): agents of a cluster register only with one of its queues, so no slot of agentd can register. "+
				"Create queue %q in the cluster whose agent token agentd registers with (its Queues page, New Queue), and give --buildkite-cluster that cluster's name to have it checked there; or correct --queue",
			org, cfg.Queue, clusterList(without), cfg.Queue)})
	}
	return out
}

func findQueue(qs []Queue, key string) (Queue, bool) {
	for _, q := range qs {
		if q.Key == key {
			return q, true
		}
	}
	return Queue{}, false
}

func queueMissing(cfg Config, org string, c Cluster, qs []Queue) Finding {
	where := fmt.Sprintf("cluster %q (%s) of Buildkite organization %s", c.Name, c.ID, org)
	page := "its Queues page"
	if c.WebURL != "" {
		page = c.WebURL + "/queues"
	}
	msg := fmt.Sprintf("%s has no queue %q: agents of a cluster register only with one of its queues, so no slot of agentd can register. "+
		"Create it (%s, New Queue, key %q), or correct --queue", where, cfg.Queue, page, cfg.Queue)
	for _, q := range qs {
		if strings.EqualFold(q.Key, cfg.Queue) {
			msg += fmt.Sprintf(" (the cluster has a queue %q: queue keys are matched exactly)", q.Key)
			break
		}
	}
	return Finding{Reason: ReasonQueueNotFound, Problem: true, Message: msg}
}

func pausedMessage(q Queue, where, endpoint, org, clusterID string) string {
	msg := fmt.Sprintf("dispatch is paused on queue %q of %s", q.Key, where)
	var by []string
	if q.PausedBy != "" {
		by = append(by, "by "+q.PausedBy)
	}
	if !q.PausedAt.IsZero() {
		by = append(by, "at "+q.PausedAt.UTC().Format(time.RFC3339))
	}
	if q.PausedNote != "" {
		by = append(by, fmt.Sprintf("note %q", q.PausedNote))
	}
	if len(by) > 0 {
		msg += " (paused " + strings.Join(by, ", ") + ")"
	}
	page := "the queue's page on Buildkite"
	if q.WebURL != "" {
		page = q.WebURL
	}
	return msg + fmt.Sprintf(": agentd's slots register but get no job until it is resumed. Resume dispatch on %s, or with "+
		"POST %sv2/organizations/%s/clusters/%s/queues/%s/resume_dispatch (a token with write_clusters)",
		page, endpointSlash(endpoint), org, clusterID, q.ID)
}

// callProblem describes a failed call: what to do about the token when Buildkite refused
// it, else that nothing further could be checked.
func callProblem(cfg Config, a Answers, err error, org, what string) Finding {
	scopes := strings.Join(requiredScopes(cfg), " and ")
	inOrg := "the organization agentd registers in"
	if org != "" {
		inOrg = "organization " + org
	}
	switch statusOf(err) {
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

func endpointSlash(e string) string {
	if e == "" {
		e = DefaultEndpoint
	}
	if !strings.HasSuffix(e, "/") {
		e += "/"
	}
	return e
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
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
