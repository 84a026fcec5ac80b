package podbuilder

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// containerEnv is the env the kubelet gives container c: each variable in order, a
// literal value expanded with the variables before it, a value from a Secret (secret maps
// its keys) as it is.
func containerEnv(t *testing.T, c corev1.Container, secret map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil:
			require.NotNil(t, e.ValueFrom.SecretKeyRef, "env %s", e.Name)
			env[e.Name] = secret[e.ValueFrom.SecretKeyRef.Key]
		default:
			env[e.Name] = podcontract.Expand(e.Value, env)
		}
	}
	return env
}

// jobText is what a pipeline author may write in a command or an env value: every form
// of "$" that Kubernetes would expand, with quotes, backslashes and newlines around it.
var jobText = []string{
	`kill -TERM $$`,
	`echo $(HOME) $(BUILDKITE_JOB_ID) $(BK_OPERATOR_JOB_ID) $(NOPE)`,
	`printf '%s\n' 'dollar: $$ paren: $(HOME) brace: ${NOPE:-x}'`,
	"echo \"a \\\"quoted\\\" $$$(HOME) \\\\back\\\\slash\"\nsleep 1 &\nwait $!\r\n\techo '$'",
	`$$$(BUILDKITE_JOB_ID)$`,
	`$(unclosed $(`,
	"$",
}

// TestJobTextReachesTheContainerVerbatim checks that whatever a pipeline author or
// Buildkite gives (the command, env values, log paths, ...) reaches the job container byte
// for byte: the kubelet expands "$(NAME)" and "$$" in literal env values, so every literal
// value the builder writes must survive that expansion. The BuildEnvironment's own env keeps
// Kubernetes' meaning: a reference there still gets the referenced value.
func TestJobTextReachesTheContainerVerbatim(t *testing.T) {
	sinks := []struct {
		name string
		// set puts text where the job (or its environment's agent settings) gives it.
		set func(job *bkv1.BuildJob, env *bkv1.BuildEnvironment, text string)
		// variable is where the job container finds it.
		variable string
	}{
		{"command", func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment, text string) { job.Spec.Command = text }, podcontract.EnvCommand},
		{"env value", func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment, text string) { job.Spec.Env["MY_VAR"] = text }, "MY_VAR"},
		{"env value made by hand", func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment, text string) {
			handMade(job)
			job.Spec.Env["MY_VAR"] = text
		}, "MY_VAR"},
		{"env value of an agent setting", func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment, text string) {
			job.Spec.Env["BUILDKITE_BUILD_PATH"] = text
		}, podcontract.EnvReplacedPrefix + "BUILDKITE_BUILD_PATH"},
		{"log path", func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment, text string) { job.Spec.LogPaths = []string{text} }, podcontract.EnvLogPaths},
		{"agent endpoint", func(job *bkv1.BuildJob, _ *bkv1.BuildEnvironment, text string) { job.Spec.AgentEndpoint = text }, podcontract.EnvEndpoint},
		{"git clone flags", func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment, text string) { env.Spec.Agent.GitCloneFlags = text }, "BUILDKITE_GIT_CLONE_FLAGS"},
		{"git fetch flags", func(_ *bkv1.BuildJob, env *bkv1.BuildEnvironment, text string) { env.Spec.Agent.GitFetchFlags = text }, "BUILDKITE_GIT_FETCH_FLAGS"},
	}
	for _, sink := range sinks {
		for _, text := range jobText {
			t.Run(sink.name+"/"+text, func(t *testing.T) {
				job, env := baseJob(), baseEnv()
				// HOME defined in the pod, and a deliberate reference to the job's variable,
				// which must still see the job's value.
				env.Spec.Env = []corev1.EnvVar{{Name: "HOME", Value: "/home/ci"}, {Name: "COPY_OF_MY_VAR", Value: "<$(MY_VAR)>"}}
				sink.set(job, env, text)
				pod, err := Build(job, env, Options{AgentEndpoint: "https://agent.buildkite.com/v3"})
				require.NoError(t, err)
				got := containerEnv(t, pod.Spec.Containers[0], nil)
				assert.Equal(t, text, got[sink.variable], "%s as the job container gets it", sink.variable)
				if sink.variable == "MY_VAR" {
					assert.Equal(t, "<"+text+">", got["COPY_OF_MY_VAR"], "a reference in the environment's env gets the job's value")
				}
				assert.Equal(t, "/home/ci", got["HOME"])
				checkInvariants(t, job, env, pod)
			})
		}
	}
}
