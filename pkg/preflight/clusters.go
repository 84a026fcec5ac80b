package preflight

import (
	"fmt"
	"strings"
)

// maxClustersSearched bounds how many clusters are searched for the queue when no cluster
// is configured: one call each.
const maxClustersSearched = 20

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
