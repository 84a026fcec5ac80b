package podbuilder

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// PodSecurityLevel is the Pod Security Standard a job namespace enforces (its label
// pod-security.kubernetes.io/enforce), which the pods built for it are made to meet.
type PodSecurityLevel string

// The Pod Security Standards' levels.
const (
	// PodSecurityRestricted is the default: job pods run as a non-root user, with no
	// privilege escalation, every capability dropped and the runtime's seccomp profile.
	PodSecurityRestricted PodSecurityLevel = "restricted"
	// PodSecurityBaseline and PodSecurityPrivileged leave the security context to the
	// BuildEnvironment (whose spec.allow still guards every privilege).
	PodSecurityBaseline   PodSecurityLevel = "baseline"
	PodSecurityPrivileged PodSecurityLevel = "privileged"
)

// DefaultRestrictedUser is the uid (and gid) of job pods in a restricted namespace whose
// environment names none: restricted forbids root, and an image whose user is root would
// otherwise not start ("container has runAsNonRoot and image will run as root").
const DefaultRestrictedUser int64 = 1000

// ParsePodSecurityLevel checks a level given by a flag.
func ParsePodSecurityLevel(s string) (PodSecurityLevel, error) {
	switch l := PodSecurityLevel(s); l {
	case PodSecurityRestricted, PodSecurityBaseline, PodSecurityPrivileged:
		return l, nil
	}
	return "", fmt.Errorf("pod security level %q: use restricted, baseline or privileged, the level the job namespace's pod-security.kubernetes.io/enforce label sets", s)
}

// String and Set make a level a flag.Value.
func (l *PodSecurityLevel) String() string { return string(*l) }

func (l *PodSecurityLevel) Set(v string) error {
	p, err := ParsePodSecurityLevel(v)
	if err != nil {
		return err
	}
	*l = p
	return nil
}

// canonicalCapabilities writes every capability of the pod's containers as the runtimes
// read it (CHOWN for chown or CAP_CHOWN). The runtimes accept any spelling but Pod Security
// admission compares names as written, so without this it would refuse a pod whose
// capabilities the guard rails (which read them as the runtimes do) allowed.
func canonicalCapabilities(pod *corev1.Pod) {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			sc := list[i].SecurityContext
			if sc == nil || sc.Capabilities == nil {
				continue
			}
			for _, caps := range [][]corev1.Capability{sc.Capabilities.Add, sc.Capabilities.Drop} {
				for j, c := range caps {
					caps[j] = corev1.Capability(validation.CapabilityName(c))
				}
			}
		}
	}
}

// meetPodSecurity fills in what the level needs where the environment left it unset, so
// that an ordinary environment runs in a restricted namespace as it is. What the
// environment sets is kept: should it break the level (runAsUser: 0, a capability added),
// Pod Security admission refuses the pod and the job's log says why.
func meetPodSecurity(pod *corev1.Pod, level PodSecurityLevel) {
	if level != PodSecurityRestricted {
		return
	}
	if pod.Spec.SecurityContext == nil {
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	psc := pod.Spec.SecurityContext
	if psc.SeccompProfile == nil {
		psc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	if psc.RunAsNonRoot == nil {
		psc.RunAsNonRoot = ptr(true)
	}
	if psc.RunAsUser == nil && !anyContainerSetsUser(pod) {
		psc.RunAsUser = ptr(DefaultRestrictedUser)
		if psc.RunAsGroup == nil {
			psc.RunAsGroup = ptr(DefaultRestrictedUser)
		}
		if psc.FSGroup == nil {
			// Volumes that keep the owner (a git mirrors claim) are writable by the job.
			psc.FSGroup = ptr(DefaultRestrictedUser)
		}
	}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			restrictContainer(&list[i])
		}
	}
}

func anyContainerSetsUser(pod *corev1.Pod) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
				return true
			}
		}
	}
	return false
}

// restrictContainer denies privilege escalation and drops every capability unless the
// container says otherwise. A privileged container keeps its escalation: the API server
// refuses privileged with allowPrivilegeEscalation false as an invalid pod, while left alone
// the namespace's Pod Security admission refuses it saying which level it breaks.
func restrictContainer(c *corev1.Container) {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	sc := c.SecurityContext
	if sc.AllowPrivilegeEscalation == nil && (sc.Privileged == nil || !*sc.Privileged) {
		sc.AllowPrivilegeEscalation = ptr(false)
	}
	if sc.Capabilities == nil {
		sc.Capabilities = &corev1.Capabilities{}
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		sc.Capabilities.Drop = append(sc.Capabilities.Drop, "ALL")
	}
}
