// Package controller holds what the operator's reconcilers share (SetupOptions, Soonest,
// WarmPods, and the warm pools' metrics, which both write: warmmetrics.go); each
// reconciler is a package of its own, and so is the work queue the BuildJob reconciler uses:
//
//	buildjob          runs each BuildJob as a pod, reports how it ended, and reaps it
//	buildenvironment  keeps each BuildEnvironment's Ready condition and warm pool
//	requeue           a work queue that keeps one wake-up per object, the latest reconcile's
package controller

import ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"

// SetupOptions are for callers that run more than one manager in a process (tests that
// restart the controller): controller-runtime refuses a second controller of one name.
type SetupOptions struct {
	SkipNameValidation bool
}

// ApplySetupOptions sets in copts what setup asks for.
func ApplySetupOptions(copts *ctrlcontroller.Options, setup []SetupOptions) {
	for _, s := range setup {
		if s.SkipNameValidation {
			skip := true
			copts.SkipNameValidation = &skip
		}
	}
}
