// Package buildjob is the reaper: the BuildJob reconciler. It runs each BuildJob as a pod,
// keeps the BuildJob's status, conditions and events true, tells Buildkite how the job ended
// (exactly once, after the pod has ended and its output is sent), and reaps the pod and
// the BuildJob afterwards.
//
// The pod itself is read by pkg/podstate, which knows the kubelet's and the scheduler's
// words: what the pod waits for, how it ended, how Kubernetes disrupted it. This package
// applies its time limits and its own words to those verdicts.
//
// Every reconcile reads the world and converges from whatever it finds, so the operator can
// be restarted at any moment without Buildkite seeing anything different. What must survive
// a restart is written to the BuildJob's status before it is acted on.
//
// The files follow the stages a BuildJob walks through:
//
//	reconciler.go  Setup, and Reconcile: which stage a BuildJob is at
//	pod.go         creating the pod, and recording what it shows in the status
//	observe.go     reading the pod and deciding whether, and how, the job ended
//	pending.go     the bounds on what keeps a pod's command from starting
//	waiting.go     what keeps the command from starting, shown on the Buildkite job
//	outcome.go     how a job ended, worked out from its pod (messages.go: the words for it)
//	disruption.go  a pod Kubernetes took away, in its author's words
//	finish.go      recording the outcome in the status, once Buildkite has what must precede it
//	report.go      telling Buildkite: start, the explanation in the log, finish
//	reap.go        letting go of the pod and the BuildJob after their retention
//	buildkite.go   the job token and the Buildkite client made with it
//	status.go      conditions and status writes; events.go: events; metrics.go: metrics
package buildjob
