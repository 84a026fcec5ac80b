package spawner

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The spawner's metrics, on controller-runtime's registry (served by the manager's
// metrics endpoint). Each carries the spawner's name, so two operators in one process
// (tests) or one cluster stay apart.
var (
	slotsMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "buildkite_operator",
		Subsystem: "spawner",
		Name:      "slots",
		Help: "Agent slots of the JobSpawner, by state: busy (holding a job), idle (pinging for one), " +
			"paused (Buildkite paused its agent: pinging, taking no job) or stopped (Buildkite stopped its agent: down until its Secret's slot-state annotation is removed).",
	}, []string{"spawner", "state"})
	acceptedMetric = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "buildkite_operator",
		Subsystem: "spawner",
		Name:      "jobs_accepted_total",
		Help:      "Buildkite jobs the JobSpawner accepted.",
	}, []string{"spawner"})
	intakeFailuresMetric = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "buildkite_operator",
		Subsystem: "spawner",
		Name:      "intake_failures_total",
		Help:      "Accepted jobs the JobSpawner could not turn into a BuildJob and finished with stack_error, by reason.",
	}, []string{"spawner", "reason"})
	runnableToBuildJobMetric = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "buildkite_operator",
		Subsystem: "spawner",
		Name:      "runnable_to_buildjob_seconds",
		Help:      "Time from a job becoming runnable in Buildkite (runnable_at) to its BuildJob existing.",
		Buckets:   prometheus.ExponentialBuckets(0.25, 2, 12),
	}, []string{"spawner"})
)

// slotStates are the values of slotsMetric's state label, each exported (0 or more) as
// soon as the spawner runs, so that a query for paused slots finds 0 rather than nothing.
var slotStates = []string{"busy", "idle", "paused", "stopped"}

func init() {
	metrics.Registry.MustRegister(slotsMetric, acceptedMetric, intakeFailuresMetric, runnableToBuildJobMetric)
}
