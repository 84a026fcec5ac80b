package warmdemand

import (
	"strings"

	"github.com/buildkite/go-buildkite/v4"
)

// Job states and types of the REST API that matter here.
const (
	// stateScheduled: the job is ready and waits for Buildkite to assign it to an agent.
	stateScheduled = "scheduled"
	// typeScript is a command job, the only kind an agent runs (wait, block and trigger
	// steps are jobs of other types).
	typeScript = "script"
)

// target is which waiting jobs agentd's slots could take.
type target struct {
	// queue is agentd's queue key (--queue).
	queue string
	// queueID is the UUID of that queue in the configured cluster; "" without a cluster.
	queueID string
	// tags are agentd's other agent tags, "key=value", without the queue.
	tags map[string][]string
}

func newTarget(queue string, extraTags []string) target {
	t := target{queue: queue, tags: map[string][]string{}}
	for _, tag := range extraTags {
		k, v, _ := strings.Cut(tag, "=")
		if k == "queue" || k == "" {
			continue // the queue is Config.Queue, as the spawner has it
		}
		t.tags[k] = append(t.tags[k], v)
	}
	return t
}

// waits reports whether j waits for an agent that agentd's slots could take.
func (t target) waits(j buildkite.Job) bool {
	if j.State != stateScheduled || (j.Type != "" && j.Type != typeScript) {
		return false
	}
	if t.queueID != "" && j.ClusterQueueID != t.queueID {
		return false
	}
	queue := "default" // a job that names no queue targets the default queue
	for _, rule := range j.AgentQueryRules {
		k, v, _ := strings.Cut(rule, "=")
		if k == "queue" {
			queue = v
			continue
		}
		if !anyMatches(v, t.tags[k]) {
			return false
		}
	}
	// In a cluster the job's cluster_queue_id has placed it already; its queue rule is
	// that queue's key, or none for the cluster's default queue.
	return t.queueID != "" || globMatch(queue, t.queue)
}

// anyMatches reports whether one of an agent's values of a tag satisfies a rule's value.
// An agent without the tag satisfies no rule on it.
func anyMatches(pattern string, values []string) bool {
	for _, v := range values {
		if globMatch(pattern, v) {
			return true
		}
	}
	return false
}

// globMatch matches s against a rule's value, in which "*" stands for any run of
// characters, as in agents: {os: "linux*"} or {postgres: "*"}; nothing else is special.
func globMatch(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}
