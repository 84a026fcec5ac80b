package podbuilder

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// agentInstallScript copies the agent image's buildkite-agent ($1) to the pod's bin volume
// ($2), or says what is wrong with the image. It needs only a shell and cp, which
// Buildkite's agent images have (Alpine's busybox, Ubuntu's coreutils), and which an image
// built from them keeps.
const agentInstallScript = `if [ ! -f "$1" ]; then echo "the agent image has no buildkite-agent at $1: use buildkite/agent, or an image built from it" >&2; exit 1; fi; exec cp "$1" "$2"`

// agentInstall is the init container that brings buildkite-agent into the pod: it runs the
// agent's image (the environment's spec.agent.image, else the operator's AgentImage) and
// copies its binary to podcontract.AgentPath, beside the supervisor that the operator's own
// init container installs. Buildkite publishes the agent as an image, and its binary is
// static, so the copy runs in any job image.
//
// The copy is BinariesInitContainer's; with BinariesImageVolume the pod mounts the image
// instead (binariesOf).
func agentInstall(image string, policy corev1.PullPolicy, binMount, workspaceMount corev1.VolumeMount) corev1.Container {
	return corev1.Container{
		Name:            podcontract.AgentInstallContainer,
		Image:           image,
		ImagePullPolicy: policy,
		// Command, not args: the agent images' entrypoint starts an agent.
		Command: []string{"/bin/sh", "-c", agentInstallScript, podcontract.AgentInstallContainer,
			podcontract.AgentImageBinaryPath, podcontract.AgentPath},
		VolumeMounts:             []corev1.VolumeMount{binMount, workspaceMount},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// runAgentInstallAsNonRoot gives the agent's init container a user where the pod must not
// run as root but names none: Buildkite's agent images run as root, and the kubelet refuses
// to start such a container under runAsNonRoot ("image will run as root"). That happens in
// a restricted namespace whose environment names a user for its own containers only. The
// copy needs no user of its own: the image's buildkite-agent is readable by all, and the
// bin volume is an emptyDir anyone may write.
func runAgentInstallAsNonRoot(pod *corev1.Pod) {
	psc := pod.Spec.SecurityContext
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.Name != podcontract.AgentInstallContainer {
			continue
		}
		sc := c.SecurityContext
		nonRoot, user := false, false
		if psc != nil {
			nonRoot = psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
			user = psc.RunAsUser != nil
		}
		if sc != nil {
			if sc.RunAsNonRoot != nil {
				nonRoot = *sc.RunAsNonRoot
			}
			user = user || sc.RunAsUser != nil
		}
		if !nonRoot || user {
			return
		}
		if c.SecurityContext == nil {
			c.SecurityContext = &corev1.SecurityContext{}
		}
		c.SecurityContext.RunAsUser = ptr(DefaultRestrictedUser)
		return
	}
}
