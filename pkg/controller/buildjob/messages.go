package buildjob

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/podstate"
)

func oomMessage(pod *corev1.Pod) string {
	limit := "no memory limit, so the node itself ran out of memory"
	if q, ok := jobMemoryLimit(pod); ok {
		limit = "a memory limit of " + q
	}
	return fmt.Sprintf("The job's container ran out of memory and was killed (OOMKilled); it had %s. Give the step more memory (its resources, or the BuildEnvironment's), or make the job use less.", limit)
}

// sigkillHint explains an exit code of 137 that came without a reason. The runtime names
// an OOM kill only when it saw the kernel's OOM event, which it can miss (a container killed
// very early, or all its processes killed together), so say what most often sends SIGKILL.
func sigkillHint(pod *corev1.Pod) string {
	limit := "the node's memory"
	if q, ok := jobMemoryLimit(pod); ok {
		limit = "its memory limit of " + q
	}
	return fmt.Sprintf(" Exit code 137 is SIGKILL, most often from the kernel's OOM killer when the job uses more than %s: if the step needs more, give it more memory (its resources, or the BuildEnvironment's).", limit)
}

// jobMemoryLimit is the job container's memory limit, if it has one.
func jobMemoryLimit(pod *corev1.Pod) (string, bool) {
	for _, c := range pod.Spec.Containers {
		if c.Name == podcontract.JobContainer {
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				return q.String(), true
			}
		}
	}
	return "", false
}

func deadlineMessage(pod *corev1.Pod) string {
	msg := "The job's pod ran past its deadline and Kubernetes stopped it"
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		msg += fmt.Sprintf(" (activeDeadlineSeconds %d: the job's timeout and a margin)", *d)
	}
	if pod.Status.Message != "" {
		msg += ": " + strings.TrimSuffix(pod.Status.Message, ".")
	}
	return msg + "."
}

func exitMessage(status int, signal string) string {
	if signal != "" {
		return fmt.Sprintf("the command was killed by %s.", signal)
	}
	return fmt.Sprintf("the command exited with status %d.", status)
}

// describeTermination says, after a container's exit code, what else its end says: a
// reason that says more than that it failed, and the signal that ended it.
func describeTermination(t *corev1.ContainerStateTerminated) string {
	var parts []string
	if r := podstate.TerminationReason(t); r != "" {
		parts = append(parts, r)
	}
	if s := podstate.Signal(t); s != "" {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// signalOr names the signal that ended a container (podstate.Signal), or def when its
// state names none.
func signalOr(t *corev1.ContainerStateTerminated, def string) string {
	if s := podstate.Signal(t); s != "" {
		return s
	}
	return def
}

// podRejectedMessage explains why the API server refused the job's pod. A Pod Security
// refusal is the cluster operator's to fix, and the author needs to know whom to ask.
func podRejectedMessage(err error, namespace, environment string) string {
	msg := "Kubernetes refused to create the job's pod: " + strings.TrimSuffix(err.Error(), ".") + "."
	if strings.Contains(err.Error(), "violates PodSecurity") {
		msg += fmt.Sprintf(" The job namespace %q enforces a Pod Security level that BuildEnvironment %q does not meet: ask a cluster operator to change the environment, or to run it where a wider level is allowed (the chart's jobNamespace.podSecurity).", namespace, environment)
	}
	return msg
}
