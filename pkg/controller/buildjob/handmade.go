package buildjob

import (
	"fmt"
	"strings"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// handMadeProblem is the outcome of a BuildJob made by hand that may not run in env, nil
// when it may. With the webhooks, the BuildJob webhook checked that its creator may use
// the environment's Secrets and service account directly. Without them nobody knows who
// made it, so it may use only an environment that gives its pods neither: nobody gets
// through the operator what they could not get directly.
func (r *Reconciler) handMadeProblem(job *bkv1.BuildJob, env *bkv1.BuildEnvironment) *outcome {
	if r.opts.Webhooks {
		return nil
	}
	given := validation.EnvironmentPrivileges(env)
	if len(given) == 0 {
		return nil
	}
	return neverRan(bkv1.ReasonEnvironmentUnchecked, fmt.Sprintf(
		"The BuildJob was made by hand and its environment %q gives its pods %s; the operator runs without its admission webhooks, "+
			"so nothing checked that the BuildJob's creator may use them. Run it with the webhooks on, or in an environment without them.",
		env.Name, strings.Join(given, ", ")), progressZero)
}
