// Package podbuilder turns a BuildJob and its BuildEnvironment into the pod that runs the job.
//
// Build is a pure function: the same inputs always give the same pod, byte for byte, so the
// controller can rebuild it on any reconcile, golden files can pin it down, and a pod name
// derived from the BuildJob means a retried create can never make a second pod.
package podbuilder

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// Labels and annotations the builder puts on every job pod.
const (
	// LabelBuildJob names the BuildJob a pod belongs to.
	LabelBuildJob = "buildkite-operator.dev/buildjob"
	// LabelManagedBy is the standard label saying who made the pod; the operator's cache
	// selects job pods with it (see ManagedBy).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is the value of LabelManagedBy on job pods.
	ManagedBy = "buildkite-operator"
	// AnnotationBuildURL links the pod to its build on Buildkite.
	AnnotationBuildURL = "buildkite-operator.dev/build-url"
	// LabelWarmPool, on a warm pod (BuildWarm), names the BuildEnvironment whose pool it is
	// in, as a label value (validation.LabelValue). A job pod never has it.
	LabelWarmPool = "buildkite-operator.dev/warm-pool"
	// AnnotationEnvironmentGeneration, on a warm pod, is the generation of the
	// BuildEnvironment it was built from: a pod of an older generation fits no job.
	AnnotationEnvironmentGeneration = "buildkite-operator.dev/environment-generation"
	// AnnotationWarmTemplate, on a warm pod, is a hash of its spec less what a job's
	// hand-off carries and its assignment patches (see WarmFits), as BuildWarm made it:
	// the pod read back from the API server has Kubernetes' defaults filled in, so its
	// spec cannot be compared with a freshly built one, but this can.
	AnnotationWarmTemplate = "buildkite-operator.dev/warm-template"
	// PodFinalizer keeps the finished pod of a BuildJob made by hand, with its termination
	// message, until the controller has read how the job ended: nothing else records it.
	// The pod of a job the operator accepted has none (a write less per job): its
	// supervisor reports the job's start and end to Buildkite itself, so the controller
	// asks Buildkite how far a job got whose pod vanished before its outcome was read
	// (pkg/controller/buildjob, lostPod). The pods of earlier releases carry it, and the
	// controller still removes it from them.
	PodFinalizer = "buildkite-operator.dev/finish"
)

// Defaults of Options.
const (
	DefaultOperatorImage = "bk-operator/agentd:dev"
	// DefaultAgentImage is Buildkite's own agent image at the release the operator is made
	// for: jobs get buildkite-agent from it unless the operator (--agent-image) or their
	// BuildEnvironment (spec.agent.image) names another. The chart's agentImage values and
	// the tests' locally built stand-in (tests/images) use the same reference.
	DefaultAgentImage = "buildkite/agent:3.138.1"
	// DefaultGracePeriod is Kubernetes' own default terminationGracePeriodSeconds.
	DefaultGracePeriod = 30 * time.Second
	// DefaultSignalGraceMargin is kept back from the grace period for the supervisor to
	// send the last output and write its progress after killing the command.
	DefaultSignalGraceMargin = 5 * time.Second
	// DefaultDeadlineMargin is added to the job's timeout for activeDeadlineSeconds:
	// Buildkite cancels a job that runs too long, and the deadline is only a backstop for
	// when that fails, so it must leave time for pulling images and the cancel itself.
	DefaultDeadlineMargin = 10 * time.Minute
	// DefaultJobStatusInterval is how often the supervisor asks Buildkite whether the job
	// was canceled.
	DefaultJobStatusInterval = 5 * time.Second
)

// Options are the operator-wide settings of every job pod.
type Options struct {
	// OperatorImage holds agentd; its entrypoint must be agentd. Default DefaultOperatorImage.
	OperatorImage string
	// OperatorImagePullPolicy of the install init container; Kubernetes' default when empty.
	OperatorImagePullPolicy corev1.PullPolicy
	// AgentImage holds buildkite-agent at /usr/local/bin/buildkite-agent, and a shell and
	// cp for the agent's init container (BinariesInitContainer); a BuildEnvironment's
	// spec.agent.image wins.
	// Default DefaultAgentImage.
	AgentImage string
	// AgentImagePullPolicy of the agent's init container (a BuildEnvironment's
	// spec.agent.imagePullPolicy wins); Kubernetes' default when empty.
	AgentImagePullPolicy corev1.PullPolicy
	// Binaries says how job pods get the supervisor and buildkite-agent from those two
	// images. Default DefaultBinaries.
	Binaries Binaries
	// AgentEndpoint is used when the BuildJob names none.
	AgentEndpoint string
	// JobStatusInterval is how often the supervisor polls the job's state.
	JobStatusInterval time.Duration
	// SignalGraceMargin is how much shorter than the grace period the supervisor's wait
	// between SIGTERM and SIGKILL is. Default DefaultSignalGraceMargin.
	SignalGraceMargin time.Duration
	// DeadlineMargin is added to the job's timeout for activeDeadlineSeconds.
	DeadlineMargin time.Duration
	// PodSecurity is the level the job namespace enforces; the pod is made to meet it
	// where the environment does not say otherwise. None when empty.
	PodSecurity PodSecurityLevel
	// ImagePullSecrets are Secrets of the job namespace that every job pod pulls with,
	// after its BuildEnvironment's own: those of the registry the operator and agent images
	// come from, which the pod's init containers pull whatever environment it runs in. A
	// pod's pull secrets serve all its images (Kubernetes has no per-container ones).
	ImagePullSecrets []corev1.LocalObjectReference

	// The hand-off settings of warm pods (BuildWarm); job pods get none of them.

	// HandoffURL is the https URL of agentd's hand-off endpoint (pkg/handoff), from which a
	// warm pod's supervisor fetches the job it is given. BuildWarm needs it.
	HandoffURL string
	// HandoffAudience is the audience of the projected ServiceAccount token a warm pod
	// proves itself with: the one the endpoint checks (handoff.Config.Audience), unique to
	// the install, so that the token is good for nothing else. BuildWarm needs it.
	HandoffAudience string
	// HandoffCAConfigMap names a ConfigMap of the job namespace whose key ca.crt
	// (HandoffCAKey) holds the CA bundle of the endpoint's serving certificate. Empty: the
	// supervisor trusts the system's roots (those of the job's image).
	HandoffCAConfigMap string
}

func (o Options) withDefaults() Options {
	if o.OperatorImage == "" {
		o.OperatorImage = DefaultOperatorImage
	}
	if o.AgentImage == "" {
		o.AgentImage = DefaultAgentImage
	}
	if o.Binaries == "" {
		o.Binaries = DefaultBinaries
	}
	if o.JobStatusInterval <= 0 {
		o.JobStatusInterval = DefaultJobStatusInterval
	}
	if o.SignalGraceMargin <= 0 {
		o.SignalGraceMargin = DefaultSignalGraceMargin
	}
	if o.DeadlineMargin <= 0 {
		o.DeadlineMargin = DefaultDeadlineMargin
	}
	return o
}

// PodName is the name of job's pod: the BuildJob's own name when it fits in a hostname (63
// characters), else a prefix of it and a hash of the whole, so two long names never collide.
func PodName(job *bkv1.BuildJob) string {
	name := job.Name
	if len(name) <= k8svalidation.DNS1123LabelMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	hash := hex.EncodeToString(sum[:])[:10]
	prefix := strings.TrimRight(name[:k8svalidation.DNS1123LabelMaxLength-len(hash)-1], "-.")
	return prefix + "-" + hash
}

// Build returns the pod that runs job in env. An error means no pod can be built: it says
// what is wrong with the environment and how to fix it.
func Build(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options) (*corev1.Pod, error) {
	if job == nil || env == nil {
		return nil, errors.New("building a pod needs both a BuildJob and its BuildEnvironment")
	}
	return build(job, env, opts, podMeta(job, env))
}

// build is the pod of job in env, with meta. With a nil job it is the pod of env's warm
// pool (BuildWarm): the same pod, without what only a job knows (its env, its resources
// and its deadline), so that the two are built by one code path and cannot drift apart.
func build(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, meta metav1.ObjectMeta) (*corev1.Pod, error) {
	opts = opts.withDefaults()
	if err := checkEnvironment(env); err != nil {
		return nil, err
	}
	s := &env.Spec
	workspaceMount := corev1.VolumeMount{Name: podcontract.WorkspaceVolume, MountPath: podcontract.WorkspaceDir}
	bins := binariesOf(env, opts, workspaceMount)
	grace, signalGrace := gracePeriods(s, opts)
	automount := s.AutomountServiceAccountToken
	enableServiceLinks := false
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			InitContainers:                initContainers(env, bins, workspaceMount),
			Containers:                    []corev1.Container{jobContainer(job, env, opts, bins, signalGrace, workspaceMount)},
			Volumes:                       podVolumes(env, bins),
			ServiceAccountName:            s.ServiceAccountName,
			AutomountServiceAccountToken:  &automount,
			EnableServiceLinks:            &enableServiceLinks,
			NodeSelector:                  maps.Clone(s.NodeSelector),
			Tolerations:                   deepCopyTolerations(s.Tolerations),
			Affinity:                      s.Affinity.DeepCopy(),
			SecurityContext:               s.PodSecurityContext.DeepCopy(),
			ImagePullSecrets:              imagePullSecrets(s.ImagePullSecrets, opts.ImagePullSecrets),
			PriorityClassName:             s.PriorityClassName,
			TerminationGracePeriodSeconds: ptr(int64(grace / time.Second)),
		},
	}
	canonicalCapabilities(pod)
	meetPodSecurity(pod, opts.PodSecurity)
	// Both need the pod's final users and groups, which meetPodSecurity may have set.
	runAgentInstallAsNonRoot(pod)
	setGitSecretModes(pod)
	if job != nil {
		setActiveDeadline(pod, job, env, opts)
	}
	return pod, nil
}

// checkEnvironment refuses an environment no pod can be built from: one without an image,
// one that takes the operator's names, or one that uses privileges it does not allow.
func checkEnvironment(env *bkv1.BuildEnvironment) error {
	if env.Spec.Image == "" {
		return fmt.Errorf("BuildEnvironment %s has no spec.image: set the image that runs the job's command", env.Name)
	}
	if err := checkReserved(env); err != nil {
		return err
	}
	// The webhook refuses these too, but it may have been off when env was admitted.
	if errs := validation.Privileges(env); len(errs) > 0 {
		return fmt.Errorf("BuildEnvironment %q uses privileges it does not allow, so it runs no job until a cluster operator allows them in its spec.allow or removes them: %w", env.Name, errs.ToAggregate())
	}
	return nil
}

// podMeta names the pod after job, labels and annotates it, makes job its controlling
// owner, and, for a BuildJob made by hand, holds it with PodFinalizer until its result is
// read.
func podMeta(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        PodName(job),
		Namespace:   job.Namespace,
		Labels:      podLabels(job, env),
		Annotations: podAnnotations(job, env),
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         bkv1.GroupVersion.String(),
			Kind:               "BuildJob",
			Name:               job.Name,
			UID:                job.UID,
			Controller:         ptr(true),
			BlockOwnerDeletion: ptr(true),
		}},
		Finalizers: podFinalizers(job),
	}
}

// podFinalizers are the finalizers of job's pod: PodFinalizer for a BuildJob made by hand,
// whose pod is the only record of how it ended; none for a job the operator accepted.
func podFinalizers(job *bkv1.BuildJob) []string {
	if bkv1.MadeByHand(job) {
		return []string{PodFinalizer}
	}
	return nil
}

// imagePullSecrets are the environment's pull secrets, then the operator's that the
// environment does not name already: each Secret once, none with an empty name (it names no
// Secret), and nil when there are none, as a pod without any has.
func imagePullSecrets(env, operator []corev1.LocalObjectReference) []corev1.LocalObjectReference {
	var out []corev1.LocalObjectReference
	for _, s := range slices.Concat(env, operator) {
		if s.Name != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// checkReserved refuses an environment that takes a name the operator needs, or names a git
// mirrors volume it does not have. The webhook refuses such environments too, but one may
// predate it.
func checkReserved(env *bkv1.BuildEnvironment) error {
	for _, group := range [][]corev1.Container{env.Spec.InitContainers, env.Spec.Sidecars} {
		for _, c := range group {
			if slices.Contains(validation.ReservedContainerNames, c.Name) {
				return fmt.Errorf("BuildEnvironment %s has a container named %q, a name the operator gives its own containers: rename it", env.Name, c.Name)
			}
		}
	}
	mirrors := env.Spec.Agent.GitMirrorsVolume
	for _, v := range env.Spec.Volumes {
		if slices.Contains(validation.ReservedVolumeNames, v.Name) {
			return fmt.Errorf("BuildEnvironment %s has a volume named %q, a name the operator gives its own volumes: rename it (configure %s with spec.workspace)", env.Name, v.Name, podcontract.WorkspaceDir)
		}
		if v.Name == mirrors {
			mirrors = ""
		}
	}
	if mirrors != "" {
		return fmt.Errorf("BuildEnvironment %s spec.agent.gitMirrorsVolume names volume %q, which is not in its spec.volumes: add the volume there", env.Name, mirrors)
	}
	return nil
}

// podLabels are the environment's podLabels, then the BuildJob's labels (which say which
// pipeline, build and step the pod runs, and which the environment must not overwrite),
// then the operator's own.
func podLabels(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) map[string]string {
	labels := map[string]string{}
	maps.Copy(labels, env.Spec.PodLabels)
	maps.Copy(labels, job.Labels)
	labels[LabelManagedBy] = ManagedBy
	if v := validation.LabelValue(job.Name); v != "" {
		labels[LabelBuildJob] = v
	}
	return labels
}

func podAnnotations(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) map[string]string {
	annotations := maps.Clone(env.Spec.PodAnnotations)
	if job.Spec.BuildURL != "" {
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[AnnotationBuildURL] = job.Spec.BuildURL
	}
	return annotations
}

func deepCopyTolerations(in []corev1.Toleration) []corev1.Toleration {
	if in == nil {
		return nil
	}
	out := make([]corev1.Toleration, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}

func ptr[T any](v T) *T { return &v }
