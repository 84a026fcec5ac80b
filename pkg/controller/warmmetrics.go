package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// The warm pools' metrics, one series per BuildEnvironment with a pool, on
// controller-runtime's registry. Both reconcilers write them: the BuildEnvironment's keeps
// the gauges (RecordWarmPool) and drops an environment's series (ForgetWarmPool), the
// BuildJob's counts the starts (CountJobStart). The environment's namespace is
// environment_namespace, not namespace: Prometheus gives every series of a scrape the
// namespace of the operator's pod, which the chart's dashboard and alerts select on.
var (
	warmPoolSizeMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "buildkite_operator",
		Subsystem: "warm_pool",
		Name:      "size",
		Help:      "Idle warm pods the BuildEnvironment asks for (spec.warmPool.size).",
	}, []string{"environment_namespace", "environment"})
	warmPoolPodsMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "buildkite_operator",
		Subsystem: "warm_pool",
		Name:      "pods",
		Help:      "Warm pods of the BuildEnvironment, by state: idle (waiting for a job) or assigned (given a job that has not finished), as its status.warmPool says.",
	}, []string{"environment_namespace", "environment", "state"})
	warmPoolStartsMetric = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "buildkite_operator",
		Subsystem: "warm_pool",
		Name:      "job_starts_total",
		Help:      "Pods that jobs of a BuildEnvironment with a warm pool started in, by the BuildJob's WarmStart condition reason: WarmPodAssigned, or the reason it started cold.",
	}, []string{"environment_namespace", "environment", "reason"})
)

func init() {
	metrics.Registry.MustRegister(warmPoolSizeMetric, warmPoolPodsMetric, warmPoolStartsMetric)
}

// RecordWarmPool sets env's pool gauges from the status the pool's keeper computed; a nil
// status (no pool, and no warm pod left) drops them, as ForgetWarmPool does.
func RecordWarmPool(env *bkv1.BuildEnvironment, st *bkv1.WarmPoolStatus) {
	if st == nil {
		ForgetWarmPool(env.Namespace, env.Name)
		return
	}
	warmPoolSizeMetric.WithLabelValues(env.Namespace, env.Name).Set(float64(st.Size))
	warmPoolPodsMetric.WithLabelValues(env.Namespace, env.Name, "idle").Set(float64(st.Idle))
	warmPoolPodsMetric.WithLabelValues(env.Namespace, env.Name, "assigned").Set(float64(st.Assigned))
}

// ForgetWarmPool drops every warm-pool series of the environment namespace/name: it was
// deleted, or has no pool any more, and a series left behind would show a pool that is
// not there.
func ForgetWarmPool(namespace, name string) {
	labels := prometheus.Labels{"environment_namespace": namespace, "environment": name}
	warmPoolSizeMetric.Delete(labels)
	warmPoolPodsMetric.DeletePartialMatch(labels)
	warmPoolStartsMetric.DeletePartialMatch(labels)
}

// CountJobStart counts a job of env starting in a pod: a warm one (ReasonWarmPodAssigned)
// or one of its own, for the reason of the job's WarmStart condition.
func CountJobStart(env *bkv1.BuildEnvironment, reason string) {
	warmPoolStartsMetric.WithLabelValues(env.Namespace, env.Name, reason).Inc()
}
