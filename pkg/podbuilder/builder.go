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
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
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
	// PodFinalizer keeps a finished pod, with the supervisor's termination message, until
	// the controller has read how the job ended. Without it a pod deleted from outside (or
	// evicted, or canceled) could vanish before its result is known.
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
	// AgentImage holds buildkite-agent at /usr/local/bin/buildkite-agent, with a shell and
	// cp, for the agent's init container (a BuildEnvironment's spec.agent.image wins).
	// Default DefaultAgentImage.
	AgentImage string
	// AgentImagePullPolicy of the agent's init container (a BuildEnvironment's
	// spec.agent.imagePullPolicy wins); Kubernetes' default when empty.
	AgentImagePullPolicy corev1.PullPolicy
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
}

func (o Options) withDefaults() Options {
	if o.OperatorImage == "" {
		o.OperatorImage = DefaultOperatorImage
	}
	if o.AgentImage == "" {
		o.AgentImage = DefaultAgentImage
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
	opts = opts.withDefaults()
	s := &env.Spec
	if s.Image == "" {
		return nil, fmt.Errorf("BuildEnvironment %s has no spec.image: set the image that runs the job's command", env.Name)
	}
	if err := checkReserved(env); err != nil {
		return nil, err
	}
	// The webhook refuses these too, but it may have been off when env was admitted.
	if errs := validation.Privileges(env); len(errs) > 0 {
		return nil, fmt.Errorf("BuildEnvironment %q uses privileges it does not allow, so it runs no job until a cluster operator allows them in its spec.allow or removes them: %w", env.Name, errs.ToAggregate())
	}

	workspaceMount := corev1.VolumeMount{Name: podcontract.WorkspaceVolume, MountPath: podcontract.WorkspaceDir}
	binMount := corev1.VolumeMount{Name: podcontract.BinVolume, MountPath: podcontract.BinDir}

	install := corev1.Container{
		Name:                     podcontract.InstallContainer,
		Image:                    opts.OperatorImage,
		ImagePullPolicy:          opts.OperatorImagePullPolicy,
		Args:                     []string{"install", "--supervisor", podcontract.ImageSupervisorPath, podcontract.SupervisorPath},
		VolumeMounts:             []corev1.VolumeMount{binMount, workspaceMount},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	initContainers := []corev1.Container{install, agentInstall(env, opts, binMount, workspaceMount)}
	for _, c := range s.InitContainers {
		c = *c.DeepCopy()
		c.VolumeMounts = withWorkspace(c.VolumeMounts, workspaceMount)
		initContainers = append(initContainers, c)
	}
	always := corev1.ContainerRestartPolicyAlways
	for _, c := range s.Sidecars {
		c = *c.DeepCopy()
		// A native sidecar: started before the command, stopped after it, and never
		// keeping the pod alive once the command has ended.
		c.RestartPolicy = &always
		c.VolumeMounts = withWorkspace(c.VolumeMounts, workspaceMount)
		initContainers = append(initContainers, c)
	}

	grace, signalGrace := gracePeriods(s, opts)

	mounts := []corev1.VolumeMount{workspaceMount, {Name: podcontract.BinVolume, MountPath: podcontract.BinDir, ReadOnly: true}}
	for _, m := range s.VolumeMounts {
		mounts = append(mounts, *m.DeepCopy())
	}
	mounts = append(mounts, agentMounts(env)...)
	mounts = append(mounts, gitMounts(env)...)

	jobContainer := corev1.Container{
		Name:            podcontract.JobContainer,
		Image:           s.Image,
		ImagePullPolicy: s.ImagePullPolicy,
		// The supervisor finishes the job itself once its output is sent: the
		// fastest finish, one call, and no status write in between.
		Command:         []string{podcontract.SupervisorPath, "--" + podcontract.FinishFlushedFlag},
		WorkingDir:      podcontract.WorkspaceDir,
		Env:             jobEnv(job, env, opts, signalGrace),
		EnvFrom:         deepCopyEnvFrom(s.EnvFrom),
		Resources:       validation.EffectiveResources(job.Spec.Resources, &s.Resources),
		VolumeMounts:    mounts,
		SecurityContext: s.SecurityContext.DeepCopy(),
		// The supervisor keeps its progress here; File (not FallbackToLogsOnError) so
		// that the job's own output is never mistaken for it.
		TerminationMessagePath:   jobprogress.DefaultPath,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}

	volumes := []corev1.Volume{
		workspaceVolume(env),
		{Name: podcontract.BinVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	for _, v := range s.Volumes {
		volumes = append(volumes, *v.DeepCopy())
	}
	volumes = append(volumes, agentVolumes(env)...)
	volumes = append(volumes, gitVolumes(env)...)

	automount := s.AutomountServiceAccountToken
	enableServiceLinks := false
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
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
			Finalizers: []string{PodFinalizer},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			InitContainers:                initContainers,
			Containers:                    []corev1.Container{jobContainer},
			Volumes:                       volumes,
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
	if minutes := timeoutMinutes(job, env); minutes > 0 {
		deadline := int64((time.Duration(minutes)*time.Minute + opts.DeadlineMargin) / time.Second)
		pod.Spec.ActiveDeadlineSeconds = &deadline
	}
	return pod, nil
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
			if c.Name == podcontract.JobContainer || c.Name == podcontract.InstallContainer || c.Name == podcontract.AgentInstallContainer {
				return fmt.Errorf("BuildEnvironment %s has a container named %q, a name the operator gives its own containers: rename it", env.Name, c.Name)
			}
		}
	}
	mirrors := env.Spec.Agent.GitMirrorsVolume
	for _, v := range env.Spec.Volumes {
		if slices.Contains([]string{podcontract.WorkspaceVolume, podcontract.BinVolume, podcontract.HooksVolume, podcontract.GitSSHVolume, podcontract.GitCredentialsVolume}, v.Name) {
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

// withWorkspace adds the /workspace mount unless the container already mounts the
// workspace volume.
func withWorkspace(mounts []corev1.VolumeMount, ws corev1.VolumeMount) []corev1.VolumeMount {
	for _, m := range mounts {
		if m.Name == ws.Name {
			return mounts
		}
	}
	return append([]corev1.VolumeMount{ws}, mounts...)
}

func workspaceVolume(env *bkv1.BuildEnvironment) corev1.Volume {
	ws := env.Spec.Workspace
	v := corev1.Volume{Name: podcontract.WorkspaceVolume}
	switch {
	case ws.VolumeClaimTemplate != nil:
		// A generic ephemeral volume: Kubernetes makes the claim, owned by the pod, and
		// deletes it with the pod.
		v.Ephemeral = &corev1.EphemeralVolumeSource{VolumeClaimTemplate: ws.VolumeClaimTemplate.DeepCopy()}
	case ws.EmptyDir != nil:
		v.EmptyDir = ws.EmptyDir.DeepCopy()
	default:
		v.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	return v
}

// jobEnv is the job container's environment, later entries winning: the job's env (given
// in clear, then taken from the token Secret), the agent's settings (agentEnv), git's
// settings for spec.git (gitEnv), the environment's env (which, being the agent's
// configuration, may change them), then what
// the operator itself sets, which nothing may override (a job must not point its token at
// another endpoint). As on an agent, the job's own values of the agent's protected
// settings are left out (and named in BUILDKITE_IGNORED_ENV).
//
// A BuildJob made by hand (bkv1.MadeByHand) gets nothing from its token Secret, neither
// the job token nor env values, and no agent endpoint: whoever made it may name any
// Secret there, and the operator must not read one for them. Its pod has
// podcontract.EnvLocal instead, and its supervisor runs the command without Buildkite.
func jobEnv(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, opts Options, signalGrace time.Duration) []corev1.EnvVar {
	// Only the operator says whether a job runs without Buildkite: a step's env that sets
	// EnvLocal would have its job's command run with nothing reaching Buildkite.
	ignored := func(k string) bool { return slices.Contains(protectedEnv, k) || k == podcontract.EnvLocal }
	var vars []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(job.Spec.Env)) {
		if ignored(k) {
			continue
		}
		vars = append(vars, literalEnv(k, job.Spec.Env[k]))
	}
	// The values the spawner keeps out of the spec (a pipeline's env holds secrets) stay
	// out of the pod spec too: the kubelet reads each from the Secret.
	for _, k := range secretEnvNames(job) {
		if ignored(k) {
			continue
		}
		vars = append(vars, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: job.Spec.TokenSecretRef.Name},
				Key:                  bkv1.EnvSecretKey(k),
			},
		}})
	}
	names := jobEnvNames(job)
	agent := agentEnv(env, names)
	vars = append(vars, agent...)
	vars = append(vars, replacedJobValues(job, agent)...)
	// What spec.git tells git, before the environment's env: an environment that sets
	// GIT_SSH_COMMAND itself has its own way.
	vars = append(vars, gitEnv(env)...)
	// As given, not through literalEnv: these are Kubernetes EnvVars, where $(NAME) is
	// Kubernetes' reference (see literalEnv).
	for _, e := range env.Spec.Env {
		vars = append(vars, *e.DeepCopy())
	}

	runner := env.Spec.EffectiveRunner()
	vars = append(vars,
		literalEnv(podcontract.EnvJobID, job.Spec.JobID),
		literalEnv(podcontract.EnvCommand, job.Spec.Command),
	)
	if bkv1.MadeByHand(job) {
		vars = append(vars, literalEnv(podcontract.EnvLocal, "true"))
	} else {
		vars = append(vars, corev1.EnvVar{Name: podcontract.EnvAccessToken, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: job.Spec.TokenSecretRef.Name},
				Key:                  job.Spec.TokenSecretRef.KeyOrDefault(),
			},
		}})
		endpoint := job.Spec.AgentEndpoint
		if endpoint == "" {
			endpoint = opts.AgentEndpoint
		}
		if endpoint != "" {
			vars = append(vars, literalEnv(podcontract.EnvEndpoint, endpoint))
		}
	}
	vars = append(vars,
		literalEnv(podcontract.EnvPodMarker, podcontract.PodMarker(job.Namespace, job.Name)),
		literalEnv(podcontract.EnvRunner, string(runner)),
	)
	if len(names) > 0 {
		vars = append(vars, literalEnv(podcontract.EnvJobEnvNames, strings.Join(names, ",")))
	}
	if len(job.Spec.LogPaths) > 0 {
		vars = append(vars, literalEnv(podcontract.EnvLogPaths, strings.Join(job.Spec.LogPaths, ";")))
	}
	if n := job.Spec.LogLimits.ChunksMaxSizeBytes; n > 0 {
		vars = append(vars, literalEnv(podcontract.EnvChunkMaxBytes, strconv.FormatInt(n, 10)))
	}
	if n := job.Spec.LogLimits.ChunksIntervalSeconds; n > 0 {
		vars = append(vars, literalEnv(podcontract.EnvChunkInterval, strconv.Itoa(int(n))))
	}
	if n := job.Spec.LogLimits.LogMaxSizeBytes; n > 0 {
		vars = append(vars, literalEnv(podcontract.EnvLogMaxBytes, strconv.FormatInt(n, 10)))
	}
	// The supervisor ends the command at the job's own timeout and tells Buildkite then;
	// the pod's activeDeadlineSeconds (Build) is only the backstop past it.
	if minutes := timeoutMinutes(job, env); minutes > 0 {
		source := podcontract.TimeoutSourceEnvironment
		if job.Spec.TimeoutMinutes != nil {
			source = podcontract.TimeoutSourceStep
		}
		vars = append(vars,
			literalEnv(podcontract.EnvTimeoutSeconds, strconv.Itoa(int(minutes)*60)),
			literalEnv(podcontract.EnvTimeoutSource, source))
	}
	vars = append(vars,
		literalEnv(podcontract.EnvJobStatusInterval, seconds(opts.JobStatusInterval)),
		literalEnv(podcontract.EnvSignalGrace, seconds(signalGrace)),
	)
	return dedupe(vars)
}

// dedupe keeps the last definition of each variable, in the position of the first, so
// the pod spec holds each name once (the API server warns about duplicates).
func dedupe(vars []corev1.EnvVar) []corev1.EnvVar {
	last := map[string]int{}
	for i, v := range vars {
		last[v.Name] = i
	}
	out := make([]corev1.EnvVar, 0, len(last))
	seen := map[string]bool{}
	for _, v := range vars {
		if seen[v.Name] {
			continue
		}
		seen[v.Name] = true
		out = append(out, vars[last[v.Name]])
	}
	return out
}

// gracePeriods are the pod's terminationGracePeriodSeconds and the supervisor's wait
// between SIGTERM and SIGKILL: spec.agent.cancelGracePeriodSeconds when set (the pod's
// grace period then long enough for it, unless the environment sets its own), else the
// pod's grace period less the margin the supervisor needs to send the last output.
func gracePeriods(s *bkv1.BuildEnvironmentSpec, opts Options) (grace, signalGrace time.Duration) {
	grace = DefaultGracePeriod
	if s.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*s.TerminationGracePeriodSeconds) * time.Second
	}
	cancel := s.Agent.CancelGracePeriodSeconds
	if cancel == nil {
		return grace, max(grace-opts.SignalGraceMargin, time.Second)
	}
	signalGrace = time.Duration(*cancel) * time.Second
	if s.TerminationGracePeriodSeconds == nil {
		return max(grace, signalGrace+opts.SignalGraceMargin), signalGrace
	}
	// The webhook refuses a grace period that does not exceed the cancel grace period; an
	// environment admitted without it still gets its SIGKILL from the supervisor first.
	return grace, max(min(signalGrace, grace-time.Second), time.Second)
}

func seconds(d time.Duration) string {
	return strconv.FormatInt(int64(max(d, time.Second)/time.Second), 10)
}

// timeoutMinutes is the job's timeout: its own, else its environment's default; 0 for none.
func timeoutMinutes(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) int32 {
	if job.Spec.TimeoutMinutes != nil {
		return *job.Spec.TimeoutMinutes
	}
	if d := env.Spec.Timeouts.DefaultMinutes; d != nil {
		return *d
	}
	return 0
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

func deepCopyEnvFrom(in []corev1.EnvFromSource) []corev1.EnvFromSource {
	if in == nil {
		return nil
	}
	out := make([]corev1.EnvFromSource, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
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
