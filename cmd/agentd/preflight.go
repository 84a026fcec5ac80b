package main

import (
	"cmp"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/startupcheck"
)

// addPreflight adds the start-up check of Buildkite (pkg/startupcheck) to mgr, on every
// replica, unless the spawner is off (nothing then registers with Buildkite). Its events
// are about the operator's own Pod, which the chart names in POD_NAME, POD_NAMESPACE and
// POD_UID.
func addPreflight(mgr ctrl.Manager, cfg *operatorConfig) error {
	if !cfg.spawnerEnabled {
		return nil
	}
	if err := cfg.preflight.Validate(); err != nil {
		return err
	}
	pod := startupcheck.PodReference(os.Getenv, cfg.manager.namespace)
	return mgr.Add(&startupcheck.Check{
		Config:    cfg.preflight,
		Queue:     cmp.Or(cfg.spawner.Queue, spawner.DefaultQueue),
		UserAgent: userAgent(),
		Events:    &startupcheck.PodEvents{Client: mgr.GetClient(), Pod: pod},
		Log:       ctrl.Log.WithName("preflight"),
	})
}
