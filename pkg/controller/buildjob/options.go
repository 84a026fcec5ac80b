package buildjob

import (
	"flag"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"

	"github.com/distribution/reference"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/imagevolume"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/seal"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// Finalizer keeps a BuildJob until Buildkite has been told how its job ended.
const Finalizer = bkv1.FinishFinalizer

// Defaults of Options: withDefaults fills them in for zero fields, and BindFlags starts
// from them. The operator image and the supervisor's poll interval default to
// podbuilder.DefaultOperatorImage and podbuilder.DefaultJobStatusInterval.
const (
	// DefaultOperatorImagePullPolicy is the flags' pull policy of the operator image;
	// Options itself leaves it to Kubernetes when empty.
	DefaultOperatorImagePullPolicy = corev1.PullIfNotPresent
	DefaultUnschedulableTimeout    = 30 * time.Minute
	DefaultImagePullGrace          = 30 * time.Second
	DefaultFailedPodRetention      = 10 * time.Minute
	DefaultBuildJobRetention       = time.Hour
	// DefaultMaxRetainedBuildJobs bounds the reported BuildJobs kept (retained.go): an hour
	// of jobs at 1.4 a second; about 55 MiB of the operator's memory (11 KiB each, with
	// the token Secret's cached copy: docs/performance.md) and of etcd's.
	DefaultMaxRetainedBuildJobs  = 5000
	DefaultJobStatePollInterval  = 5 * time.Second
	DefaultPodTerminationTimeout = 2 * time.Minute
	DefaultResyncInterval        = time.Minute
	// A reconcile mostly waits on round trips (the API server, Buildkite), so workers are
	// cheap and many keep a large pool of jobs moving: 4 were busy 95 % of the time with
	// 100 jobs in flight, and a job waited seconds for one (docs/performance.md).
	DefaultMaxConcurrentReconciles = 16
	DefaultTokenWaitTimeout        = 2 * time.Minute
	DefaultQuotaTimeout            = 5 * time.Minute
	DefaultPodSetupTimeout         = 5 * time.Minute
	DefaultRunningJobStateInterval = 30 * time.Second
	DefaultCancelMargin            = 30 * time.Second
	DefaultBuildkiteTimeout        = 10 * time.Second
	DefaultBuildkiteRetryInterval  = 10 * time.Second
	// DefaultPhaseSettle is the flag's: a pod's state that lasts less than this is not
	// written to its BuildJob's status. Options itself writes every state at once when
	// PhaseSettle is 0.
	DefaultPhaseSettle = 2 * time.Second
)

// Options configure the controller. Zero values take the defaults above.
type Options struct {
	// OperatorImage holds agentd, for the job pods' install init container.
	OperatorImage string
	// OperatorImagePullPolicy of the install init container.
	OperatorImagePullPolicy corev1.PullPolicy
	// AgentImage is the image job pods get buildkite-agent from (podbuilder.Options); the
	// pod builder's DefaultAgentImage when empty.
	AgentImage string
	// AgentImagePullPolicy of the agent's init container, or its image volume.
	AgentImagePullPolicy corev1.PullPolicy
	// BinariesFrom is what the operator is told of how job pods get their binaries
	// (--binaries-from); the operator resolves it into Binaries when it starts
	// (imagevolume.Choose).
	BinariesFrom imagevolume.Mode
	// Binaries is how job pods get the supervisor and buildkite-agent
	// (podbuilder.Options); podbuilder.DefaultBinaries when empty.
	Binaries podbuilder.Binaries
	// ImagePullSecrets are Secrets of the job namespace every job pod pulls with, after
	// its BuildEnvironment's own (podbuilder.Options): the operator and agent images' in
	// a private registry, which every pod's init containers pull.
	ImagePullSecrets []corev1.LocalObjectReference
	// PodSecurity is the Pod Security level of the job namespace, which job pods are made
	// to meet; none when empty (the flag's default is restricted).
	PodSecurity podbuilder.PodSecurityLevel
	// AgentEndpoint is the Buildkite agent API of BuildJobs that name none.
	AgentEndpoint string
	// AllowedAgentEndpoints are the further endpoints a BuildJob's spec.agentEndpoint may
	// name (validation.EndpointAllowed): the job token goes to no other.
	AllowedAgentEndpoints []string
	// DefaultBuildEnvironment is the environment of BuildJobs that name none.
	DefaultBuildEnvironment string
	// Webhooks says the operator's admission webhooks run: they check who makes a
	// BuildJob by hand, and what environment they may use (handMadeProblem).
	Webhooks bool
	// Seal gives the operator's seal key, which tells the token Secrets the spawner made
	// from any other (pkg/seal). Required.
	Seal *seal.Source
	// AgentAPI is the base of the job-token clients: user agent, timeouts, retry wait
	// scale, transport. Endpoint and Token are set per job.
	AgentAPI agentapi.Config
	// Handoff is the registry through which warm pods fetch their jobs (pkg/handoff):
	// nil when the operator serves no hand-off endpoint, and then every job starts in a
	// pod of its own, whatever its environment's spec.warmPool says.
	Handoff *handoff.Registry
	// HandoffURL, HandoffAudience and HandoffCAConfigMap are what warm pods are told of the
	// hand-off endpoint (podbuilder.Options).
	HandoffURL, HandoffAudience, HandoffCAConfigMap string

	// UnschedulableTimeout is how long a pod may stay unschedulable before its job fails
	// (or the job's own timeout, when shorter). Long by default: a cluster autoscaler may
	// take many minutes to add a node, and the job waits with a live notice meanwhile.
	UnschedulableTimeout time.Duration
	// ImagePullGrace is how long an image may fail to pull (or a container fail to be
	// created) before the job fails.
	ImagePullGrace time.Duration
	// FailedPodRetention keeps the pod of a job that did not pass, for debugging, unless
	// its environment says otherwise.
	FailedPodRetention time.Duration
	// BuildJobRetention keeps a reported BuildJob unless its environment says otherwise.
	BuildJobRetention time.Duration
	// MaxRetainedBuildJobs is the most reported BuildJobs kept: beyond it the longest
	// reported are deleted before their retention ends.
	MaxRetainedBuildJobs int
	// JobStatePollInterval is how often the state of a job whose command has not started
	// yet is read from Buildkite, to notice a cancel.
	JobStatePollInterval time.Duration
	// JobStatusInterval is how often the supervisor polls the job's state.
	JobStatusInterval time.Duration
	// PodTerminationTimeout is how long past its deletion deadline a pod may take to end
	// before its node is taken for lost.
	PodTerminationTimeout time.Duration
	// ResyncInterval is how often a running job is looked at when nothing changes.
	ResyncInterval time.Duration
	// MaxConcurrentReconciles is how many BuildJobs are reconciled at once.
	MaxConcurrentReconciles int
	// TokenWaitTimeout bounds each wait for the job token Secret: before the pod is
	// created, the job fails without it; once the job has ended, it is given up as not
	// reportable. A BuildJob being deleted does not wait at all.
	TokenWaitTimeout time.Duration
	// QuotaTimeout is how long the pod's create may be refused for an exceeded
	// ResourceQuota before the job fails.
	QuotaTimeout time.Duration
	// PodSetupTimeout is how long a scheduled pod may fail to get ready to start its
	// containers (a volume that will not mount or attach, a sandbox that cannot be
	// created) before the job fails.
	PodSetupTimeout time.Duration
	// RunningJobStateInterval is how often the state of a job whose command runs is read
	// from Buildkite, to notice a cancel the supervisor does not act on.
	RunningJobStateInterval time.Duration
	// CancelMargin is how long past the pod's grace period and the supervisor's poll
	// interval a command may keep running after Buildkite asked to stop it, before the
	// controller deletes the pod and finishes the job itself.
	CancelMargin time.Duration
	// BuildkiteTimeout bounds the Buildkite calls of one reconcile, retries included,
	// so that a slow Buildkite never holds a reconcile worker for long.
	BuildkiteTimeout time.Duration
	// BuildkiteRetryInterval is how soon a reconcile whose Buildkite call failed or
	// ran out of time is tried again (with jitter).
	BuildkiteRetryInterval time.Duration

	// PhaseSettle is how long the job's pod must show a state (pending, scheduled, the
	// command running) before the BuildJob's status says so: a job that passes through
	// them quicker has only its outcome written, one status write instead of up to four.
	// 0 writes each state as soon as it is seen.
	PhaseSettle time.Duration

	// Recorder records the Kubernetes events; the manager's when nil.
	Recorder events.EventRecorder
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// BindFlags adds the controller's flags to fs, writing into o; each has an environment
// variable twin named in its help (parse fs with flagenv.Parse). The agent endpoint and
// the default build environment are not among them: the operator gives them once, as
// the spawner's flags, and copies them into o.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	flagenv.String(fs, &o.OperatorImage, "operator-image", "BK_OPERATOR_IMAGE", podbuilder.DefaultOperatorImage,
		"image holding agentd, whose agentd-supervise job pods run (mounted as an image volume, or copied by an init container: --binaries-from)")
	flagenv.String(fs, &o.OperatorImagePullPolicy, "operator-image-pull-policy", "BK_OPERATOR_IMAGE_PULL_POLICY", DefaultOperatorImagePullPolicy,
		"pull policy of the operator image in job pods")
	o.bindAgentImageFlags(fs)
	flagenv.Func(fs, "job-image-pull-secrets", "BK_OPERATOR_JOB_IMAGE_PULL_SECRETS",
		"Secrets of the job namespace, comma-separated names, that every job pod pulls its images with besides its BuildEnvironment's imagePullSecrets: those of a private registry the operator and agent images come from",
		func(v string) error {
			refs, err := parsePullSecrets(v)
			o.ImagePullSecrets = refs
			return err
		})
	o.PodSecurity = podbuilder.PodSecurityRestricted
	flagenv.Var(fs, &o.PodSecurity, "job-pod-security", "BK_OPERATOR_JOB_POD_SECURITY",
		"the Pod Security level (restricted, baseline or privileged) the job namespace enforces: job pods are made to meet it where their BuildEnvironment does not say otherwise (restricted runs them as uid 1000 unless the environment names a user)")
	flagenv.Duration(fs, &o.UnschedulableTimeout, "unschedulable-timeout", "BK_OPERATOR_UNSCHEDULABLE_TIMEOUT", DefaultUnschedulableTimeout,
		"how long a job's pod may wait for a node (one a cluster autoscaler adds, say) before the job fails; the job's own timeout, when shorter, bounds it instead")
	flagenv.Duration(fs, &o.ImagePullGrace, "image-pull-grace", "BK_OPERATOR_IMAGE_PULL_GRACE", DefaultImagePullGrace,
		"how long an image may fail to pull before the job fails")
	flagenv.Duration(fs, &o.FailedPodRetention, "failed-pod-retention", "BK_OPERATOR_FAILED_POD_RETENTION", DefaultFailedPodRetention,
		"how long the pod of a failed job is kept for debugging, unless its BuildEnvironment says otherwise")
	flagenv.Int(fs, &o.MaxRetainedBuildJobs, "max-retained-buildjobs", "BK_OPERATOR_MAX_RETAINED_BUILDJOBS", DefaultMaxRetainedBuildJobs,
		"the most reported BuildJobs kept (with their pods and token Secrets): beyond it the longest reported are deleted before their retention ends, so that etcd and the operator's memory stay bounded at any job rate")
	flagenv.Duration(fs, &o.JobStatusInterval, "job-status-interval", "BK_OPERATOR_JOB_STATUS_INTERVAL", podbuilder.DefaultJobStatusInterval,
		"how often job pods poll Buildkite for a cancel")
	flagenv.Int(fs, &o.MaxConcurrentReconciles, "max-concurrent-reconciles", "BK_OPERATOR_MAX_CONCURRENT_RECONCILES", DefaultMaxConcurrentReconciles,
		"how many BuildJobs the controller reconciles at once; a reconcile mostly waits on the API server and Buildkite, so more than the operator's CPUs")
	flagenv.Duration(fs, &o.TokenWaitTimeout, "token-wait-timeout", "BK_OPERATOR_TOKEN_WAIT_TIMEOUT", DefaultTokenWaitTimeout,
		"how long a job waits for its token Secret before it fails, or once ended is given up unreported")
	flagenv.Duration(fs, &o.QuotaTimeout, "quota-timeout", "BK_OPERATOR_QUOTA_TIMEOUT", DefaultQuotaTimeout,
		"how long a job's pod may be refused for an exceeded ResourceQuota before the job fails")
	flagenv.Duration(fs, &o.PodSetupTimeout, "pod-setup-timeout", "BK_OPERATOR_POD_SETUP_TIMEOUT", DefaultPodSetupTimeout,
		"how long a scheduled pod may fail to mount its volumes or create its sandbox before the job fails")
	flagenv.Duration(fs, &o.RunningJobStateInterval, "running-job-state-interval", "BK_OPERATOR_RUNNING_JOB_STATE_INTERVAL", DefaultRunningJobStateInterval,
		"how often the controller asks Buildkite for the state of a job whose command runs")
	flagenv.Duration(fs, &o.CancelMargin, "cancel-margin", "BK_OPERATOR_CANCEL_MARGIN", DefaultCancelMargin,
		"how long past its grace period a canceled job's pod may run before the controller deletes it and finishes the job")
	flagenv.Duration(fs, &o.BuildkiteTimeout, "buildkite-timeout", "BK_OPERATOR_BUILDKITE_TIMEOUT", DefaultBuildkiteTimeout,
		"how long one reconcile may spend on calls to Buildkite, retries included, before it tries again later")
	flagenv.Duration(fs, &o.PhaseSettle, "phase-settle", "BK_OPERATOR_PHASE_SETTLE", DefaultPhaseSettle,
		"how long a job's pod must stay pending, scheduled or running before its BuildJob's status says so (a write to the API server each); 0 writes each at once")
}

// parsePullSecrets reads -job-image-pull-secrets: Secret names separated by commas, none
// when empty. A name no Secret could have is refused at start-up, rather than every job
// pod's create.
func parsePullSecrets(v string) ([]corev1.LocalObjectReference, error) {
	var refs []corev1.LocalObjectReference
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if errs := k8svalidation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("image pull secret %q is not a Secret's name: %s", name, strings.Join(errs, "; "))
		}
		refs = append(refs, corev1.LocalObjectReference{Name: name})
	}
	return refs, nil
}

func (o Options) withDefaults() Options {
	if o.OperatorImage == "" {
		o.OperatorImage = podbuilder.DefaultOperatorImage
	}
	if o.AgentEndpoint == "" {
		o.AgentEndpoint = agentapi.DefaultEndpoint
	}
	if o.UnschedulableTimeout <= 0 {
		o.UnschedulableTimeout = DefaultUnschedulableTimeout
	}
	if o.ImagePullGrace <= 0 {
		o.ImagePullGrace = DefaultImagePullGrace
	}
	if o.FailedPodRetention <= 0 {
		o.FailedPodRetention = DefaultFailedPodRetention
	}
	if o.BuildJobRetention <= 0 {
		o.BuildJobRetention = DefaultBuildJobRetention
	}
	if o.MaxRetainedBuildJobs <= 0 {
		o.MaxRetainedBuildJobs = DefaultMaxRetainedBuildJobs
	}
	if o.JobStatePollInterval <= 0 {
		o.JobStatePollInterval = DefaultJobStatePollInterval
	}
	if o.PodTerminationTimeout <= 0 {
		o.PodTerminationTimeout = DefaultPodTerminationTimeout
	}
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = DefaultResyncInterval
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	}
	if o.TokenWaitTimeout <= 0 {
		o.TokenWaitTimeout = DefaultTokenWaitTimeout
	}
	if o.QuotaTimeout <= 0 {
		o.QuotaTimeout = DefaultQuotaTimeout
	}
	if o.PodSetupTimeout <= 0 {
		o.PodSetupTimeout = DefaultPodSetupTimeout
	}
	if o.RunningJobStateInterval <= 0 {
		o.RunningJobStateInterval = DefaultRunningJobStateInterval
	}
	if o.CancelMargin <= 0 {
		o.CancelMargin = DefaultCancelMargin
	}
	if o.JobStatusInterval <= 0 {
		o.JobStatusInterval = podbuilder.DefaultJobStatusInterval
	}
	if o.BuildkiteTimeout <= 0 {
		o.BuildkiteTimeout = DefaultBuildkiteTimeout
	}
	if o.BuildkiteRetryInterval <= 0 {
		o.BuildkiteRetryInterval = DefaultBuildkiteRetryInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// endpointAllowed reports whether a BuildJob's spec.agentEndpoint may get its job token:
// empty (AgentEndpoint is used), AgentEndpoint itself, or one of AllowedAgentEndpoints.
func (o Options) endpointAllowed(endpoint string) bool {
	return validation.EndpointAllowed(endpoint, o.AgentEndpoint, o.AllowedAgentEndpoints...)
}

func (o Options) podOptions() podbuilder.Options {
	return podbuilder.Options{
		OperatorImage:           o.OperatorImage,
		OperatorImagePullPolicy: o.OperatorImagePullPolicy,
		AgentImage:              o.AgentImage,
		AgentImagePullPolicy:    o.AgentImagePullPolicy,
		Binaries:                o.Binaries,
		AgentEndpoint:           o.AgentEndpoint,
		JobStatusInterval:       o.JobStatusInterval,
		PodSecurity:             o.PodSecurity,
		ImagePullSecrets:        o.ImagePullSecrets,
		HandoffURL:              o.HandoffURL,
		HandoffAudience:         o.HandoffAudience,
		HandoffCAConfigMap:      o.HandoffCAConfigMap,
	}
}

// PodOptions are the pod builder's options the controller builds job pods with, which
// warm pods must be built with too (the BuildEnvironment reconciler's warm pools).
func (o Options) PodOptions() podbuilder.Options { return o.podOptions() }

// bindAgentImageFlags adds the flags of the agent's image to fs. Both are checked as they
// are parsed, so that a mistake stops the operator at once, with the flag's name, instead
// of failing every job's pod.
func (o *Options) bindAgentImageFlags(fs *flag.FlagSet) {
	o.AgentImage, o.AgentImagePullPolicy = podbuilder.DefaultAgentImage, corev1.PullIfNotPresent
	flagenv.Var(fs, imageFlag{&o.AgentImage}, "agent-image", "BK_OPERATOR_AGENT_IMAGE",
		"image job pods get buildkite-agent from (at /usr/local/bin/buildkite-agent; with a shell and cp when copied by an init container), unless their BuildEnvironment names one in spec.agent.image")
	flagenv.Var(fs, pullPolicyFlag{&o.AgentImagePullPolicy}, "agent-image-pull-policy", "BK_OPERATOR_AGENT_IMAGE_PULL_POLICY",
		"pull policy of the agent image in job pods: Always, IfNotPresent or Never")
	o.BinariesFrom = imagevolume.Auto
	flagenv.Var(fs, &o.BinariesFrom, "binaries-from", "BK_OPERATOR_BINARIES_FROM",
		"how job pods get the supervisor and buildkite-agent from the operator's and the agent's images: image-volume (mounted, no init container; needs Kubernetes 1.35 and containerd 2.1 or CRI-O 1.31 on every node), init-container (copied; works everywhere), or auto (image-volume when the API server and every node at start-up have it)")
}

// imageFlag is a flag of an image reference, refused unless the kubelet could parse it.
type imageFlag struct{ p *string }

func (f imageFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}

func (f imageFlag) Set(v string) error {
	if _, err := reference.ParseNormalizedNamed(v); err != nil {
		return fmt.Errorf("image %q: %w; give one such as %s", v, err, podbuilder.DefaultAgentImage)
	}
	*f.p = v
	return nil
}

// pullPolicyFlag is a flag of a pull policy, one of those Kubernetes knows.
type pullPolicyFlag struct{ p *corev1.PullPolicy }

func (f pullPolicyFlag) String() string {
	if f.p == nil {
		return ""
	}
	return string(*f.p)
}

func (f pullPolicyFlag) Set(v string) error {
	switch p := corev1.PullPolicy(v); p {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
		*f.p = p
		return nil
	}
	return fmt.Errorf("pull policy %q: use Always, IfNotPresent or Never", v)
}
