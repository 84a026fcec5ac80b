package warmdemand

import (
	"testing"

	"github.com/buildkite/go-buildkite/v4"
	"github.com/stretchr/testify/assert"
)

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"linux", "linux", true},
		{"linux", "linux-arm64", false},
		{"*", "", true},
		{"*", "anything", true},
		{"linux*", "linux-arm64", true},
		{"linux*", "darwin", false},
		{"*64", "linux-arm64", true},
		{"l*-*64", "linux-arm64", true},
		{"a*a", "a", false},
		{"ab*b", "ab", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "acb", false},
	} {
		assert.Equal(t, tc.want, globMatch(tc.pattern, tc.s), "%q ~ %q", tc.pattern, tc.s)
	}
}

// Which waiting jobs agentd's slots could take: on its queue (or its cluster queue), with
// every other tag the job asks for among agentd's.
func TestTargetWaits(t *testing.T) {
	plain := newTarget("bk-operator", []string{"cluster=gke-prod", "os=linux", "queue=ignored", "=empty"})
	clustered := plain
	clustered.queueID = "q-1"
	job := func(state, typ, queueID string, rules ...string) buildkite.Job {
		return buildkite.Job{State: state, Type: typ, ClusterQueueID: queueID, AgentQueryRules: rules}
	}
	for _, tc := range []struct {
		name   string
		target target
		job    buildkite.Job
		want   bool
	}{
		{"scheduled on the queue", plain, job("scheduled", "script", "", "queue=bk-operator"), true},
		{"of no type given", plain, job("scheduled", "", "", "queue=bk-operator"), true},
		{"running", plain, job("running", "script", "", "queue=bk-operator"), false},
		{"assigned to an agent", plain, job("assigned", "script", "", "queue=bk-operator"), false},
		{"waiting on a dependency", plain, job("waiting", "script", "", "queue=bk-operator"), false},
		{"a trigger step", plain, job("scheduled", "trigger", "", "queue=bk-operator"), false},
		{"another queue", plain, job("scheduled", "script", "", "queue=other"), false},
		{"no queue: the default one", plain, job("scheduled", "script", ""), false},
		{"no queue, and agentd's is default", newTarget("default", nil), job("scheduled", "script", ""), true},
		{"a queue pattern", plain, job("scheduled", "script", "", "queue=bk-*"), true},
		{"a tag agentd has", plain, job("scheduled", "script", "", "queue=bk-operator", "cluster=gke-prod"), true},
		{"a tag value agentd lacks", plain, job("scheduled", "script", "", "queue=bk-operator", "cluster=eks"), false},
		{"a tag agentd has not", plain, job("scheduled", "script", "", "queue=bk-operator", "gpu=true"), false},
		{"any value of a tag agentd has", plain, job("scheduled", "script", "", "queue=bk-operator", "os=*"), true},
		{"in the cluster's queue", clustered, job("scheduled", "script", "q-1", "queue=bk-operator"), true},
		{"in the cluster's default queue, no queue rule", clustered, job("scheduled", "script", "q-1"), true},
		{"in another cluster's queue of the key", clustered, job("scheduled", "script", "q-2", "queue=bk-operator"), false},
		{"in the cluster's queue, for another operator", clustered, job("scheduled", "script", "q-1", "queue=bk-operator", "cluster=eks"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.target.waits(tc.job))
		})
	}
}
