package gen

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Defaults of a BuildJob built by BuildJob.
const (
	// DefaultJobID is the Buildkite job UUID of a BuildJob that is given none.
	DefaultJobID = "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f"
	// DefaultPipeline is the pipeline slug of a BuildJob that is given none.
	DefaultPipeline = "my-app"
	// DefaultBuildNumber is the build number of a BuildJob that is given none.
	DefaultBuildNumber = 42
	// DefaultCommand is the command of a BuildJob that is given none.
	DefaultCommand = "make test"
)

// BuildJobModifier changes a BuildJob being built.
type BuildJobModifier func(*v1alpha1.BuildJob)

// BuildJob is a valid BuildJob named name: job DefaultJobID of build DefaultBuildNumber of
// DefaultPipeline, running DefaultCommand, with its token in the Secret name+"-token" under
// the default key, as the spawner makes them; then mods, in order. It has no
// namespace, labels or BuildEnvironment unless a modifier gives them.
func BuildJob(name string, mods ...BuildJobModifier) *v1alpha1.BuildJob {
	bj := &v1alpha1.BuildJob{}
	bj.Name = name
	bj.Spec = v1alpha1.BuildJobSpec{
		JobID:          DefaultJobID,
		PipelineSlug:   DefaultPipeline,
		BuildNumber:    DefaultBuildNumber,
		Command:        DefaultCommand,
		TokenSecretRef: v1alpha1.SecretKeyRef{Name: name + "-token", Key: v1alpha1.DefaultSecretKey},
	}
	return apply(bj, mods)
}

// BuildJobFrom is a copy of bj changed by mods, in order; bj is left as it is.
func BuildJobFrom(bj *v1alpha1.BuildJob, mods ...BuildJobModifier) *v1alpha1.BuildJob {
	return apply(bj.DeepCopy(), mods)
}

// SetBuildJobNamespace puts the BuildJob in namespace ns.
func SetBuildJobNamespace(ns string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Namespace = ns }
}

// SetBuildJobUID sets the BuildJob's UID, as the API server would.
func SetBuildJobUID(uid types.UID) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.UID = uid }
}

// AddBuildJobLabels adds labels to the BuildJob's metadata.
func AddBuildJobLabels(labels map[string]string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) {
		if bj.Labels == nil {
			bj.Labels = map[string]string{}
		}
		for k, v := range labels {
			bj.Labels[k] = v
		}
	}
}

// SetBuildJobJobID sets the Buildkite job UUID.
func SetBuildJobJobID(id string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.JobID = id }
}

// SetBuildJobPipeline sets the pipeline slug.
func SetBuildJobPipeline(slug string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.PipelineSlug = slug }
}

// SetBuildJobBuildNumber sets the build number.
func SetBuildJobBuildNumber(n int64) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.BuildNumber = n }
}

// SetBuildJobBuildURL sets the link to the build on Buildkite.
func SetBuildJobBuildURL(url string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.BuildURL = url }
}

// SetBuildJobStepKey sets the step's key.
func SetBuildJobStepKey(key string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.StepKey = key }
}

// SetBuildJobStepLabel sets the step's label as Buildkite shows it (spec.label).
func SetBuildJobStepLabel(label string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.Label = label }
}

// SetBuildJobCommand sets the step's command.
func SetBuildJobCommand(cmd string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.Command = cmd }
}

// SetBuildJobAgentTags sets the step's agent tags.
func SetBuildJobAgentTags(tags map[string]string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.AgentTags = tags }
}

// SetBuildJobEnv sets the job's env.
func SetBuildJobEnv(env map[string]string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.Env = env }
}

// SetBuildJobEnvironment names the BuildEnvironment the job runs in.
func SetBuildJobEnvironment(name string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.BuildEnvironment = name }
}

// SetBuildJobLogPaths sets the files whose content is streamed into the log.
func SetBuildJobLogPaths(paths ...string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.LogPaths = paths }
}

// SetBuildJobTimeoutMinutes sets the job's timeout.
func SetBuildJobTimeoutMinutes(minutes int32) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.TimeoutMinutes = ptr.To(minutes) }
}

// SetBuildJobResources sets the resources the step asks for.
func SetBuildJobResources(r corev1.ResourceRequirements) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.Resources = &r }
}

// SetBuildJobTokenSecretRef sets the reference to the job token's Secret key.
func SetBuildJobTokenSecretRef(ref v1alpha1.SecretKeyRef) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.TokenSecretRef = ref }
}

// SetBuildJobAgentEndpoint sets the agent API base URL the job reports to.
func SetBuildJobAgentEndpoint(url string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.AgentEndpoint = url }
}

// SetBuildJobLogLimits sets the log-chunk limits Buildkite gave the job.
func SetBuildJobLogLimits(limits v1alpha1.LogLimits) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) { bj.Spec.LogLimits = limits }
}

// SetBuildJobIntake marks the BuildJob as the spawner's, made by the intake with this
// nonce (v1alpha1.AnnotationIntake); without it a BuildJob is made by hand.
func SetBuildJobIntake(nonce string) BuildJobModifier {
	return func(bj *v1alpha1.BuildJob) {
		if bj.Annotations == nil {
			bj.Annotations = map[string]string{}
		}
		bj.Annotations[v1alpha1.AnnotationIntake] = nonce
	}
}
