package validation

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/suggest"
)

// maxListed is how many environment names a message lists before "and N more".
const maxListed = 10

// chooseHow tells a pipeline author where an environment is chosen.
const chooseHow = "the buildkite-operator plugin's build_environment option (or BK_OPERATOR_BUILD_ENVIRONMENT in the step's env)"

// EnvironmentProblem says, for the author of pipeline, why its job cannot run in the
// environment named asked: it names none, the environment does not exist (env nil), or
// the pipeline may not use it. The message lists the environments of available that the
// pipeline may use and, when one is close, suggests the nearest name. It has no field
// paths and no kubectl commands: it goes into the Buildkite log, and kubectl users find
// those details in events and conditions. "" when the environment exists and the pipeline
// may use it.
func EnvironmentProblem(pipeline, asked string, env *bkv1.BuildEnvironment, available []bkv1.BuildEnvironment) string {
	var b strings.Builder
	switch {
	case asked == "":
		b.WriteString("The step names no BuildEnvironment and the operator has no default one: name the BuildEnvironment the job runs in with " + chooseHow + ".")
	case env == nil:
		fmt.Fprintf(&b, "BuildEnvironment %q does not exist.", asked)
	case !PipelineAllowed(env, pipeline):
		fmt.Fprintf(&b, "The pipeline %q may not use BuildEnvironment %q, which is for pipelines matching %s.", pipeline, env.Name, quoteList(env.Spec.AllowedPipelines))
	default:
		return ""
	}
	usable := UsableEnvironments(pipeline, available)
	if len(usable) == 0 {
		fmt.Fprintf(&b, " No BuildEnvironment that can run jobs allows pipeline %q; ask a cluster operator for one.", pipeline)
		return b.String()
	}
	if near := Nearest(asked, usable); asked != "" && near != "" {
		fmt.Fprintf(&b, " Did you mean %q?", near)
	}
	fmt.Fprintf(&b, " Pipeline %q may use %s", pipeline, listNames(usable))
	switch {
	case asked == "":
	case env == nil:
		b.WriteString("; choose one with " + chooseHow)
	default:
		fmt.Fprintf(&b, "; choose one with %s, or ask a cluster operator to allow pipeline %q in BuildEnvironment %q", chooseHow, pipeline, env.Name)
	}
	b.WriteString(".")
	return b.String()
}

// UsableEnvironments are the names, sorted, of the environments of available that
// pipeline may use and that can run jobs (BuildEnvironment finds no error in them).
func UsableEnvironments(pipeline string, available []bkv1.BuildEnvironment) []string {
	var names []string
	for i := range available {
		env := &available[i]
		if !env.DeletionTimestamp.IsZero() || !PipelineAllowed(env, pipeline) {
			continue
		}
		if errs, _ := BuildEnvironment(env); len(errs) > 0 {
			continue
		}
		names = append(names, env.Name)
	}
	slices.Sort(names)
	return names
}

// ListEnvironments returns the BuildEnvironments of namespace.
func ListEnvironments(ctx context.Context, r client.Reader, namespace string) ([]bkv1.BuildEnvironment, error) {
	var list bkv1.BuildEnvironmentList
	if err := r.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing BuildEnvironments in namespace %q: %w", namespace, err)
	}
	return list.Items, nil
}

// ForPipelineAuthors is errs as a pipeline author should read them in the Buildkite log:
// each problem's own words, without the field path and error type kubectl puts before
// them.
func ForPipelineAuthors(errs field.ErrorList) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Detail
		if out[i] == "" {
			out[i] = e.ErrorBody()
		}
	}
	return out
}

// Nearest is the name in names closest to asked by edit distance (ignoring case), when it
// is close enough to be the one meant: at most two edits, or a third of asked's length
// for longer names. Ties go to the name first in alphabetical order; "" when none is close.
func Nearest(asked string, names []string) string {
	return suggest.Nearest(asked, slices.Sorted(slices.Values(names)), max(2, len(asked)/3))
}

// listNames quotes names, cut after maxListed with "and N more".
func listNames(names []string) string {
	if len(names) <= maxListed {
		return quoteList(names)
	}
	return fmt.Sprintf("%s and %d more", quoteList(names[:maxListed]), len(names)-maxListed)
}
