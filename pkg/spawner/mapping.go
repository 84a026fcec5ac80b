package spawner

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/buildkite/agent/v3/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Job env variables the mapping reads or removes.
const (
	envAccessToken  = "BUILDKITE_AGENT_ACCESS_TOKEN"
	envAgentToken   = "BUILDKITE_AGENT_TOKEN"
	envPlugins      = "BUILDKITE_PLUGINS"
	envPipelineSlug = "BUILDKITE_PIPELINE_SLUG"
	envOrgSlug      = "BUILDKITE_ORGANIZATION_SLUG"
	envBuildID      = "BUILDKITE_BUILD_ID"
	envBuildNumber  = "BUILDKITE_BUILD_NUMBER"
	envBuildURL     = "BUILDKITE_BUILD_URL"
	envStepKey      = "BUILDKITE_STEP_KEY"
	envLabel        = "BUILDKITE_LABEL"
	envCommand      = "BUILDKITE_COMMAND"
	envMessage      = podcontract.EnvMessage
)

// messageTruncation says how truncateMessage cuts env's BUILDKITE_MESSAGE, in the words
// the agent logs it with; "" when it is short enough to be left alone.
func messageTruncation(env map[string]string) string {
	n := len(env[envMessage])
	if n <= podcontract.MessageMax {
		return ""
	}
	return fmt.Sprintf("%s value truncated %d -> %d bytes", envMessage, n, podcontract.MessageKept)
}

// truncateMessage cuts env's BUILDKITE_MESSAGE as the agent does before it runs a job
// (podcontract.TruncateMessage), here, before the value goes into the token Secret: the
// kubelet puts it into the supervisor's env, whose exec it would fail.
func truncateMessage(env map[string]string) {
	if v, ok := env[envMessage]; ok {
		env[envMessage] = podcontract.TruncateMessage(v)
	}
}

// secretEnv are job env variables that hold credentials: they reach the pod only
// through the token Secret, never through the BuildJob's spec.
var secretEnv = []string{envAccessToken, envAgentToken}

var jobIDRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// jobToRun is the job as it runs once the policy let it (d): its env with what the agent
// adds before bootstrap runs (jobpolicy.AgentEnv and d.Env, replacing the job's own values),
// and d.Log for the supervisor to print first (podcontract.EnvIntakeLog). job is not changed:
// the policy was checked against the job as Buildkite sent it. The error is for the
// pipeline author.
func jobToRun(job *api.Job, d jobpolicy.Decision) (*api.Job, *intakeError) {
	add, err := jobpolicy.AgentEnv(job)
	if err != nil {
		return nil, &intakeError{IntakeInvalidJob, fmt.Sprintf("Buildkite sent a job the operator cannot read: %v", err)}
	}
	run := *job
	run.Env = maps.Clone(job.Env)
	if run.Env == nil {
		run.Env = map[string]string{}
	}
	// Only the spawner writes the lines the supervisor prints before the job's own: a
	// step's env must not forge them (a "signature verified" that nobody verified).
	delete(run.Env, podcontract.EnvIntakeLog)
	maps.Copy(run.Env, add)
	maps.Copy(run.Env, d.Env)
	if d.Log != "" {
		run.Env[podcontract.EnvIntakeLog] = d.Log
	}
	return &run, nil
}

// buildJobFor maps an accepted job to its BuildJob (without the defaults and checks the
// admission webhooks apply). The error, an *intakeError, is written for the pipeline
// author.
func buildJobFor(job *api.Job, namespace, endpoint string) (*v1alpha1.BuildJob, error) {
	if !jobIDRE.MatchString(job.ID) {
		return nil, &intakeError{IntakeInvalidJob, fmt.Sprintf("Buildkite sent a job whose id %q is not a UUID", job.ID)}
	}
	src := job.Env
	if src == nil {
		src = map[string]string{}
	}
	opts, err := plugin.FromJob(withoutIntakeLog(src))
	if err != nil {
		return nil, &intakeError{IntakeInvalidOptions, fmt.Sprintf(
			"the step's buildkite-operator options are invalid:\n%v\nFix the plugin's options (or the BK_OPERATOR_* step env) in the pipeline, then retry the job.", err)}
	}
	p, problems := readJob(job, src, opts)
	if len(problems) > 0 {
		return nil, &intakeError{IntakeInvalidJob, "Buildkite sent a job the operator cannot read:\n" + strings.Join(problems, "\n")}
	}

	name := BuildJobName(job.ID)
	if job.Endpoint != "" {
		endpoint = job.Endpoint
	}
	bj := &v1alpha1.BuildJob{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "BuildJob"},
		// Made with the controller's finalizer: a BuildJob deleted before the controller
		// first sees it still gets its job finished, by the controller.
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Finalizers: []string{v1alpha1.FinishFinalizer}},
		Spec: v1alpha1.BuildJobSpec{
			JobID:            name,
			OrganizationSlug: src[envOrgSlug],
			PipelineSlug:     p.slug,
			BuildID:          src[envBuildID],
			BuildNumber:      p.number,
			BuildURL:         src[envBuildURL],
			StepKey:          firstNonEmpty(job.Step.Key, src[envStepKey]),
			Label:            firstNonEmpty(job.Step.Label, src[envLabel]),
			Command:          firstNonEmpty(job.Step.Command, src[envCommand]),
			AgentTags:        p.tags,
			Env:              p.env,
			BuildEnvironment: opts.BuildEnvironment,
			LogPaths:         slices.Clone(opts.LogPaths),
			TimeoutMinutes:   opts.TimeoutMinutes,
			Resources:        p.resources,
			TokenSecretRef:   v1alpha1.SecretKeyRef{Name: v1alpha1.TokenSecretName(name, ""), Key: v1alpha1.DefaultSecretKey},
			AgentEndpoint:    endpoint,
			LogLimits: v1alpha1.LogLimits{
				ChunksMaxSizeBytes:    clampInt64(job.ChunksMaxSizeBytes),
				ChunksIntervalSeconds: int32(min(max(job.ChunksIntervalSeconds, 0), 1<<20)),
				LogMaxSizeBytes:       clampInt64(job.LogMaxSizeBytes),
			},
		},
	}
	return bj, nil
}

// jobParts are what a BuildJob takes from its job that must be read, not just copied.
type jobParts struct {
	env       map[string]string // the job's env for the pod (podEnv)
	slug      string
	number    int64
	tags      map[string]string
	resources *corev1.ResourceRequirements
}

// readJob reads the parts of job (its env src, its step options opts) that may not be
// readable: each of problems says what Buildkite sent that the operator cannot read.
func readJob(job *api.Job, src map[string]string, opts plugin.Options) (p jobParts, problems []string) {
	p.env, problems = podEnv(src)
	p.slug = src[envPipelineSlug]
	if p.slug == "" {
		problems = append(problems, "the job env has no BUILDKITE_PIPELINE_SLUG")
	}
	var err error
	p.number, err = strconv.ParseInt(src[envBuildNumber], 10, 64)
	if err != nil || p.number < 1 {
		problems = append(problems, fmt.Sprintf("the job env's BUILDKITE_BUILD_NUMBER %q is not a build number", src[envBuildNumber]))
	}
	if p.tags, err = agentTags(job.Step.RemainingFields["agents"]); err != nil {
		problems = append(problems, err.Error())
	}
	if p.resources, err = resources(opts.Resources); err != nil {
		problems = append(problems, err.Error())
	}
	return p, problems
}

// podEnv is the job's env src as its pod gets it: without the credentials of secretEnv,
// BUILDKITE_MESSAGE cut as the agent cuts it, and BUILDKITE_PLUGINS without the
// operator's own plugin (gone when it was the only one). src is not changed.
func podEnv(src map[string]string) (env map[string]string, problems []string) {
	env = maps.Clone(src)
	for _, k := range secretEnv {
		delete(env, k)
	}
	truncateMessage(env)
	if pj, ok := env[envPlugins]; ok {
		stripped, err := plugin.StripOperatorPlugin(pj)
		if err != nil {
			problems = append(problems, fmt.Sprintf("BUILDKITE_PLUGINS: %v", err))
		}
		if stripped == "" {
			delete(env, envPlugins)
		} else {
			env[envPlugins] = stripped
		}
	}
	return env, problems
}

// withoutIntakeLog is env without podcontract.EnvIntakeLog, which the spawner put there
// (jobToRun): of the BK_OPERATOR_* variables of a job's env, the only one that is not a
// step's option. env itself is not changed.
func withoutIntakeLog(env map[string]string) map[string]string {
	if _, ok := env[podcontract.EnvIntakeLog]; !ok {
		return env
	}
	out := maps.Clone(env)
	delete(out, podcontract.EnvIntakeLog)
	return out
}

// agentTags reads a step's agents: a map (queue: x) or a list of "key=value".
func agentTags(agents any) (map[string]string, error) {
	switch a := agents.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		out := make(map[string]string, len(a))
		for k, v := range a {
			out[k] = scalar(v)
		}
		return out, nil
	case []any:
		out := make(map[string]string, len(a))
		for _, el := range a {
			s, ok := el.(string)
			k, v, found := strings.Cut(s, "=")
			if !ok || !found || k == "" {
				return nil, fmt.Errorf("the step's agents entry %v is not a \"key=value\" string", el)
			}
			out[k] = v
		}
		return out, nil
	default:
		// go-pipeline keeps unknown fields as ordered maps; anything with a
		// ToMap-style shape that is not handled above is reported, not guessed.
		if m, ok := toStringMap(agents); ok {
			return m, nil
		}
		return nil, fmt.Errorf("the step's agents is %T: it must be a map or a list of \"key=value\" strings", agents)
	}
}

// toStringMap handles go-pipeline's ordered.MapSA without importing it.
func toStringMap(v any) (map[string]string, bool) {
	type ranger interface {
		Range(func(k string, v any) error) error
	}
	r, ok := v.(ranger)
	if !ok {
		return nil, false
	}
	out := map[string]string{}
	_ = r.Range(func(k string, v any) error {
		out[k] = scalar(v)
		return nil
	})
	return out, true
}

func scalar(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// resources turns the plugin's resources into the Kubernetes form.
func resources(r *plugin.Resources) (*corev1.ResourceRequirements, error) {
	if r == nil {
		return nil, nil
	}
	var errs []error
	list := func(kind string, l *plugin.ResourceList) corev1.ResourceList {
		if l == nil {
			return nil
		}
		out := corev1.ResourceList{}
		for name, q := range map[corev1.ResourceName]plugin.Quantity{
			corev1.ResourceCPU:              l.CPU,
			corev1.ResourceMemory:           l.Memory,
			corev1.ResourceEphemeralStorage: l.EphemeralStorage,
		} {
			if q == "" {
				continue
			}
			parsed, err := resource.ParseQuantity(string(q))
			if err != nil {
				errs = append(errs, fmt.Errorf("resources.%s.%s %q is not a quantity such as 500m or 2Gi", kind, name, q))
				continue
			}
			out[name] = parsed
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	out := &corev1.ResourceRequirements{Requests: list("requests", r.Requests), Limits: list("limits", r.Limits)}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if out.Requests == nil && out.Limits == nil {
		return nil, nil
	}
	return out, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func clampInt64(v uint64) int64 {
	if v > 1<<62 {
		return 1 << 62
	}
	return int64(v)
}
