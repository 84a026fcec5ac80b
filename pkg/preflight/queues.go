package preflight

import (
	"fmt"
	"strings"
	"time"
)

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
	msg += ", or --buildkite-cluster if agentd's agent token is of another cluster"
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

func endpointSlash(e string) string {
	if e == "" {
		e = DefaultEndpoint
	}
	if !strings.HasSuffix(e, "/") {
		e += "/"
	}
	return e
}
