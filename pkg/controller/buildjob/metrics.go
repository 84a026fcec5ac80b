package buildjob

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The controller's Prometheus metrics, served with controller-runtime's own on the
// manager's metrics endpoint. Reconcile counts, errors and durations are controller-runtime's
// own (controller_runtime_reconcile_*, label controller="buildjob"), not repeated here.
var (
	podRunningSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "buildkite_operator_buildjob_to_running_seconds",
		Help:    "Time from a BuildJob's creation to its command running in its pod.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 14),
	})
	finishLatencySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "buildkite_operator_pod_end_to_finish_seconds",
		Help:    "Time from a job's pod ending to Buildkite accepting its finish.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
	})
	jobsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "buildkite_operator_jobs_finished_total",
		Help: "Jobs reported to Buildkite, by how they ended (the Finished condition's reason).",
	}, []string{"reason"})
	logBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buildkite_operator_job_log_bytes_total",
		Help: "Bytes of job output Buildkite acknowledged, counted when each job is reported.",
	})
	logChunksFailed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buildkite_operator_job_log_chunks_failed_total",
		Help: "Log chunks Buildkite refused, whose output is missing from a job's log.",
	})
	buildkiteErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "buildkite_operator_agent_api_errors_total",
		Help: "Failed calls to the Buildkite agent API made by the controller, by call.",
	}, []string{"call"})
)

func init() {
	metrics.Registry.MustRegister(podRunningSeconds, finishLatencySeconds,
		jobsFinished, logBytes, logChunksFailed, buildkiteErrors)
}
