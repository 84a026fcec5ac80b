// Package controller is the reaper: the BuildJob reconciler. It runs each BuildJob as a pod,
// keeps the BuildJob's status, conditions and events true, tells Buildkite how the job ended
// (exactly once, after the pod has ended and its output is sent), and reaps the pod and
// the BuildJob afterwards.
//
// Every reconcile reads the world and converges from whatever it finds, so the operator can
// be restarted at any moment without Buildkite seeing anything different. What must survive
// a restart is written to the BuildJob's status before it is acted on.
package controller

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// Finalizer keeps a BuildJob until Buildkite has been told how its job ended.
const Finalizer = "buildkite-operator.dev/finish"

// Options configure the controller. Zero values take the defaults below.
type Options struct {
	// OperatorImage holds agentd, for the job pods' install init container.
	OperatorImage string
	// OperatorImagePullPolicy of the install init container.
	OperatorImagePullPolicy corev1.PullPolicy
	// AgentEndpoint is the Buildkite agent API of BuildJobs that name none.
	AgentEndpoint string
	// DefaultBuildEnvironment is the environment of BuildJobs that name none.
	DefaultBuildEnvironment string
	// AgentAPI is the base of the job-token clients: user agent, timeouts, retry wait
	// scale, transport. Endpoint and Token are set per job.
	AgentAPI agentapi.Config

	// UnschedulableTimeout is how long a pod may stay unschedulable before its job fails.
	// Default 5m.
	UnschedulableTimeout time.Duration
	// ImagePullGrace is how long an image may fail to pull (or a container fail to be
	// created) before the job fails. Default 30s.
	ImagePullGrace time.Duration
	// FailedPodRetention keeps the pod of a job that did not pass, for debugging, unless
	// its environment says otherwise. Default 10m.
	FailedPodRetention time.Duration
	// BuildJobRetention keeps a reported BuildJob unless its environment says otherwise.
	// Default 1h.
	BuildJobRetention time.Duration
	// JobStatePollInterval is how often the state of a job whose command has not started
	// yet is read from Buildkite, to notice a cancel. Default 5s.
	JobStatePollInterval time.Duration
	// JobStatusInterval is how often the supervisor polls the job's state. Default 5s.
	JobStatusInterval time.Duration
	// PodTerminationTimeout is how long past its deletion deadline a pod may take to end
	// before its node is taken for lost. Default 2m.
	PodTerminationTimeout time.Duration
	// ResyncInterval is how often a running job is looked at when nothing changes.
	// Default 1m.
	ResyncInterval time.Duration
	// MaxConcurrentReconciles is how many BuildJobs are reconciled at once. Default 4.
	MaxConcurrentReconciles int

	// Recorder records the Kubernetes events; the manager's when nil.
	Recorder events.EventRecorder
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

func (o Options) withDefaults() Options {
	if o.OperatorImage == "" {
		o.OperatorImage = podbuilder.DefaultOperatorImage
	}
	if o.AgentEndpoint == "" {
		o.AgentEndpoint = agentapi.DefaultEndpoint
	}
	if o.UnschedulableTimeout <= 0 {
		o.UnschedulableTimeout = 5 * time.Minute
	}
	if o.ImagePullGrace <= 0 {
		o.ImagePullGrace = 30 * time.Second
	}
	if o.FailedPodRetention <= 0 {
		o.FailedPodRetention = 10 * time.Minute
	}
	if o.BuildJobRetention <= 0 {
		o.BuildJobRetention = time.Hour
	}
	if o.JobStatePollInterval <= 0 {
		o.JobStatePollInterval = 5 * time.Second
	}
	if o.PodTerminationTimeout <= 0 {
		o.PodTerminationTimeout = 2 * time.Minute
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = time.Minute
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = 4
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

func (o Options) podOptions() podbuilder.Options {
	return podbuilder.Options{
		OperatorImage:           o.OperatorImage,
		OperatorImagePullPolicy: o.OperatorImagePullPolicy,
		AgentEndpoint:           o.AgentEndpoint,
		JobStatusInterval:       o.JobStatusInterval,
	}
}
