package podbuilder

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// literalEnv is a variable whose value the container gets byte for byte. The kubelet
// expands a literal env value (as it does command and args): "$(NAME)" becomes the value
// of an earlier variable and "$$" becomes "$". A step's `kill -TERM $$` would run as
// `kill -TERM $`, and a command naming $(BUILDKITE_JOB_ID) would have it replaced before
// the shell saw it; the agent passes both verbatim. So every value the builder writes
// itself (the command, the job's env, agent settings, log paths) goes through here, its
// every "$" doubled, which the kubelet turns back into the one "$". Values from a Secret
// (valueFrom) are never expanded and need nothing.
//
// What the BuildEnvironment gives as Kubernetes objects (spec.env, its sidecars and init
// containers) is not escaped: there "$(NAME)" means what Kubernetes says it means, and a
// reference to a job's variable still gets the job's value, as the kubelet substitutes
// the value it has already expanded.
func literalEnv(name, value string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, Value: strings.ReplaceAll(value, "$", "$$")}
}
