package preflight

import (
	"context"
	"fmt"
	"slices"

	"github.com/buildkite/go-buildkite/v4"
)

// Need is a scope of the API token that a reader of Buildkite needs, and what for: the
// message of a token that lacks it says so.
type Need struct {
	// Scope is the scope, such as read_builds.
	Scope string
	// For says what it does, after its name: "read_builds lists the builds and their jobs".
	For string
}

// Needs are the scopes Lookup of cfg needs: own, the caller's, then those of the lookup
// itself that own lacks (read_clusters with a cluster, read_organizations without an
// organization).
func Needs(cfg Config, own ...Need) []Need {
	needs := slices.Clone(own)
	add := func(n Need) {
		if !slices.ContainsFunc(needs, func(o Need) bool { return o.Scope == n.Scope }) {
			needs = append(needs, n)
		}
	}
	if cfg.Cluster != "" {
		add(Need{Scope: ScopeReadClusters, For: fmt.Sprintf("finds queue %q in cluster %q", cfg.Queue, cfg.Cluster)})
	}
	if cfg.Organization == "" {
		add(Need{Scope: ScopeReadOrganizations, For: "finds the organization (give --buildkite-organization to need it no more)"})
	}
	return needs
}

// Scopes are the names of needs' scopes.
func Scopes(needs []Need) []string {
	out := make([]string, 0, len(needs))
	for _, n := range needs {
		out = append(out, n.Scope)
	}
	return out
}

// Found is what Lookup found.
type Found struct {
	// Organization is the organization's slug.
	Organization string
	// Cluster is the configured cluster, and Queue its queue of key Config.Queue; both are
	// zero without Config.Cluster.
	Cluster Cluster
	Queue   Queue
}

// LookupError is what Lookup found wrong with the token or the configuration: a scope the
// token lacks, or an organization, cluster or queue that cannot be found. Its Finding says
// what to fix, in the start-up check's words.
type LookupError struct {
	Finding Finding
}

func (e *LookupError) Error() string { return e.Finding.Message }

// Lookup finds, with bk, the organization agentd registers in and, with cfg.Cluster, that
// cluster and its queue of key cfg.Queue, with the start-up check's calls and judgements;
// without cfg.Cluster no cluster is read. The token must have the scopes of Needs(cfg,
// own...). A call that fails is an *APIError, for the caller to say what it means to it (a
// 5xx may pass; a 401 will not); what is wrong or missing is a *LookupError. Whether
// dispatch is paused on the queue is for the caller to judge (Found.Queue.DispatchPaused).
func Lookup(ctx context.Context, bk *buildkite.Client, cfg Config, own ...Need) (Found, error) {
	needs := Needs(cfg, own...)
	return locate(cfg, needs, ask(ctx, bk, 0, cfg, needs, false))
}

// locate judges the answers of Lookup's calls, as Evaluate judges the start-up check's.
func locate(cfg Config, needs []Need, a Answers) (Found, error) {
	if a.TokenErr != nil {
		return Found{}, a.TokenErr
	}
	if f, stop := checkScopes(a.Token, needs); stop {
		return Found{}, &LookupError{Finding: f}
	}
	if a.OrganizationsErr != nil {
		return Found{}, a.OrganizationsErr
	}
	org, f, ok := resolveOrganization(cfg, a)
	if !ok {
		return Found{}, &LookupError{Finding: f}
	}
	if cfg.Cluster == "" {
		return Found{Organization: org}, nil
	}
	if a.ClustersErr != nil {
		return Found{}, a.ClustersErr
	}
	targets, f, ok := matchClusters(cfg, org, a.Clusters)
	if !ok {
		return Found{}, &LookupError{Finding: f}
	}
	c := targets[0] // a configured cluster matches one or none
	if err := a.QueuesErr[c.ID]; err != nil {
		return Found{}, err
	}
	q, ok := findQueue(a.Queues[c.ID], cfg.Queue)
	if !ok {
		return Found{}, &LookupError{Finding: queueMissing(cfg, org, c, a.Queues[c.ID])}
	}
	return Found{Organization: org, Cluster: c, Queue: q}, nil
}
