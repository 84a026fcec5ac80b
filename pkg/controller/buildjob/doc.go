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
// Because every reconcile says when it must look again, few watch events bring one
// (watch.go: a pod's moves from one state to another, a token Secret's creation or new
// token), and the work queue keeps one wake-up per BuildJob, the latest reconcile's
// (pkg/controller/requeue). docs/architecture.md ("What brings a reconcile") says why.
//
// Each reconcile has a scope (scope.go): the BuildJob, and what the reconcile reads once
// however many stages need it (the pod, the environment, the pod's events, the Buildkite
// client), its clock, its Buildkite budget and the requeue it asks for. The stages take it
// (ctx, *scope) and ask in it when to look again; the soonest wins. Between reconciles,
// the process remembers of each BuildJob only what its cache may not show yet and what
// saves calls (memory.go), forgotten when the BuildJob is gone.
//
// The files, set up first and then in the order of the stages a BuildJob walks through:
//
//	reconciler.go   Setup, and Reconcile: which stage a BuildJob is at
//	scope.go        one reconcile: what it reads, its clock and its requeue
//	memory.go       what this process remembers of each BuildJob between reconciles
//	watch.go        which events of the pods and Secrets a BuildJob owns bring a reconcile
//	options.go      the controller's flags and defaults
//	cache.go        what the manager's cache keeps of Secrets, pods and BuildJobs (ConfigureCache)
//	cache_guard.go  why a trimmed BuildJob is never written back (GuardTrimmed)
//	pod.go          creating the pod, and recording what it shows in the status
//	environment.go  why a job may not run in its BuildEnvironment, in the spawner's words
//	handmade.go     whether a BuildJob made by hand may run in its environment
//	observe.go      reading the pod and deciding whether, and how, the job ended
//	pending.go      the bounds on what keeps a pod's command from starting, and its events
//	waiting.go      what keeps the command from starting, shown on the Buildkite job
//	outcome.go      how a job ended, worked out from its pod (messages.go: the words for it)
//	disruption.go   a pod Kubernetes took away, in its author's words
//	finish.go       recording the outcome in the status, once Buildkite has what must precede it
//	report.go       telling Buildkite: start, the explanation in the log, finish
//	reap.go         letting go of the pod and the BuildJob after their retention
//	retained.go     the cap on reported BuildJobs kept, whatever the job rate
//	buildkite.go    the job token and the Buildkite client made with it
//	status.go       conditions and status writes; events.go: events; metrics.go: metrics
package buildjob
