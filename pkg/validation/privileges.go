package validation

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// appArmorAnnotationPrefix is the annotation by which pods asked for an AppArmor profile
// before the appArmorProfile fields; the kubelet still honours it.
const appArmorAnnotationPrefix = "container.apparmor.security.beta.kubernetes.io/"

// Privileges reports each setting of env that needs a privilege env.Spec.Allow does not
// grant: privileged containers, privilege escalation, root, host paths and ports,
// unconfined profiles, SELinux options beyond a confined type, unsafe sysctls, added
// capabilities, Secrets (in env, envFrom, every volume source that names one and spec.git), Kubernetes
// API access, shared PersistentVolumeClaims, priority classes and tolerated taints. With nothing allowed, what it lets
// through meets the Baseline Pod Security Standard (FuzzBuildWithoutAllows checks that
// against Kubernetes' own checks). The webhook, the BuildEnvironment controller and the
// pod builder all call it, so an environment admitted while the webhook was off still
// cannot run a pod with them.
func Privileges(env *bkv1.BuildEnvironment) field.ErrorList {
	return checkPrivileges(env).errs
}

// EnvironmentPrivileges describes, shortly and for people, each privilege env gives its pods,
// allowed or not: `Secret "db"` (imagePullSecrets included), `service account "deployer"`,
// "privileged containers", `PersistentVolumeClaim "cache"`, ... in the order of the spec,
// without repeats; none for an environment that needs no allow. It walks the spec as
// Privileges does, so the two cannot disagree on what is a privilege. A BuildJob made by
// hand names its environment and its pipeline slug itself, so the environment's
// allowedPipelines say nothing about who made it: the operator refuses such a BuildJob an
// environment for which this is not empty unless its maker could have had the privileges
// directly (the webhook asks the API server; without webhooks nobody can be asked).
func EnvironmentPrivileges(env *bkv1.BuildEnvironment) []string {
	p := checkPrivileges(env)
	for _, s := range env.Spec.ImagePullSecrets {
		p.use(fmt.Sprintf("Secret %q", s.Name))
	}
	return p.uses
}

// EnvironmentSecrets are the names of the Secrets env's pods get, in the order of the spec
// and without repeats: those its containers' env and envFrom, its volumes and spec.git refer
// to, and its imagePullSecrets (which jobs cannot read, but pull with).
func EnvironmentSecrets(env *bkv1.BuildEnvironment) []string {
	names := checkPrivileges(env).secrets
	for _, s := range env.Spec.ImagePullSecrets {
		if !slices.Contains(names, s.Name) {
			names = append(names, s.Name)
		}
	}
	return names
}

func checkPrivileges(env *bkv1.BuildEnvironment) *privilegeCheck {
	p := &privilegeCheck{allow: &env.Spec.Allow}
	s := &env.Spec
	spec := field.NewPath("spec")

	p.container(spec, s.SecurityContext, s.Env, s.EnvFrom, nil)
	for _, group := range []struct {
		field      string
		containers []corev1.Container
	}{{"initContainers", s.InitContainers}, {"sidecars", s.Sidecars}} {
		for i := range group.containers {
			c := &group.containers[i]
			p.container(spec.Child(group.field).Index(i), c.SecurityContext, c.Env, c.EnvFrom, c.Ports)
		}
	}
	p.pod(spec.Child("podSecurityContext"), s.PodSecurityContext)
	for i := range s.Volumes {
		p.volume(spec.Child("volumes").Index(i), &s.Volumes[i])
	}
	for _, k := range slices.Sorted(maps.Keys(s.PodAnnotations)) {
		// As for the fields: only the runtime's default or a profile on the node.
		if v := s.PodAnnotations[k]; strings.HasPrefix(k, appArmorAnnotationPrefix) && v != "runtime/default" && !strings.HasPrefix(v, "localhost/") {
			p.deny(p.allow.Unconfined, spec.Child("podAnnotations").Key(k), noAppArmor, "unconfined")
		}
	}
	if sa := s.ServiceAccountName; sa != "" && sa != "default" {
		p.denyUse(fmt.Sprintf("service account %q", sa), p.allow.ServiceAccount, spec.Child("serviceAccountName"), fmt.Sprintf(
			"runs the pods as service account %q, with whatever it may do in the cluster", sa), "serviceAccount")
	}
	if s.AutomountServiceAccountToken {
		p.deny(p.allow.ServiceAccount, spec.Child("automountServiceAccountToken"), apiToken, "serviceAccount")
	}
	if pc := s.PriorityClassName; pc != "" {
		p.use(fmt.Sprintf("priority class %q", pc))
		if !slices.Contains(p.allow.PriorityClasses, pc) {
			p.errs = append(p.errs, field.Forbidden(spec.Child("priorityClassName"), fmt.Sprintf(
				"priority class %q may let jobs preempt other pods of the cluster; allow it by listing it in spec.allow.priorityClasses", pc)))
		}
	}
	for i := range s.Tolerations {
		p.toleration(spec.Child("tolerations").Index(i), &s.Tolerations[i])
	}
	// The git Secrets are mounted into the job's container: jobs can read them like any
	// other Secret the environment names, so they take the same allow (and grant).
	if g := s.Git.SSHSecret; g != nil {
		p.secret(spec.Child("git", "sshSecret", "name"), g.Name)
	}
	if g := s.Git.CredentialsSecret; g != nil {
		p.secret(spec.Child("git", "credentialsSecret", "name"), g.Name)
	}
	return p
}

const (
	privilegedWhy = "a privileged container can reach the node and every pod on it"
	noSeccomp     = "runs without a seccomp filter, with every system call open"
	noAppArmor    = "runs without an AppArmor profile"
	asRoot        = "runs as root (uid 0)"
	apiToken      = "gives jobs a Kubernetes API token"
)

// DefaultTolerations are the taint keys any pod may tolerate without an allow: the node
// conditions the DefaultTolerationSeconds admission plugin has every pod tolerate for five
// minutes, whose tolerationSeconds environments may want to change.
var DefaultTolerations = []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}

// tolerateAll is the entry of allow.tolerations that lets a pod tolerate every taint.
const tolerateAll = "*"

type privilegeCheck struct {
	allow *bkv1.Allow
	errs  field.ErrorList
	// uses describes each privilege the environment uses, allowed or not, once
	// (EnvironmentPrivileges); secrets are the Secrets it refers to (EnvironmentSecrets).
	uses    []string
	secrets []string
}

// usesOf describes the privilege of each boolean allow field, for EnvironmentPrivileges.
var usesOf = map[string]string{
	"privileged":          "privileged containers",
	"privilegeEscalation": "privilege escalation",
	"runAsRoot":           "running as root",
	"hostPath":            "hostPath volumes",
	"hostPorts":           "host ports",
	"unconfined":          "no seccomp or AppArmor confinement",
	"serviceAccount":      "a Kubernetes API token",
}

// use records a privilege the environment uses.
func (c *privilegeCheck) use(what string) {
	if !slices.Contains(c.uses, what) {
		c.uses = append(c.uses, what)
	}
}

// deny reports p unless allowed, saying why it is a privilege and which allow field lets it.
func (c *privilegeCheck) deny(allowed bool, p *field.Path, why, allowField string) {
	c.denyUse(usesOf[allowField], allowed, p, why, allowField)
}

// denyUse is deny for a privilege described otherwise than by its allow field.
func (c *privilegeCheck) denyUse(use string, allowed bool, p *field.Path, why, allowField string) {
	c.use(use)
	if allowed {
		return
	}
	c.errs = append(c.errs, field.Forbidden(p, fmt.Sprintf("%s; allow it with spec.allow.%s: true", why, allowField)))
}

// secret reports a reference to a Secret the environment does not list: the Secrets of a
// job namespace include the job tokens of other jobs and, where the operator shares it,
// the operator's own.
func (c *privilegeCheck) secret(p *field.Path, name string) {
	c.use(fmt.Sprintf("Secret %q", name))
	if !slices.Contains(c.secrets, name) {
		c.secrets = append(c.secrets, name)
	}
	if slices.Contains(c.allow.Secrets, name) {
		return
	}
	c.errs = append(c.errs, field.Forbidden(p, fmt.Sprintf(
		"Secret %q is not in spec.allow.secrets; list it there to let jobs read it", name)))
}

// toleration reports a toleration of a taint whose key the environment does not list: taints
// keep nodes for some pods only, and tolerating every taint puts jobs anywhere, the control
// plane included.
func (c *privilegeCheck) toleration(p *field.Path, t *corev1.Toleration) {
	if t.Key == "" {
		// An empty key tolerates every taint (with operator Exists, the only one the API
		// server takes with it): whatever its effect, count it as tolerating all.
		c.use("tolerating every taint")
		if !slices.Contains(c.allow.Tolerations, tolerateAll) {
			c.errs = append(c.errs, field.Forbidden(p.Child("key"),
				`an empty key tolerates every taint, letting jobs onto any node, the control plane's included; allow it by listing "*" in spec.allow.tolerations`))
		}
		return
	}
	if slices.Contains(DefaultTolerations, t.Key) {
		return
	}
	c.use(fmt.Sprintf("toleration of taint %q", t.Key))
	if !slices.Contains(c.allow.Tolerations, t.Key) && !slices.Contains(c.allow.Tolerations, tolerateAll) {
		c.errs = append(c.errs, field.Forbidden(p.Child("key"), fmt.Sprintf(
			"tolerating taint %q lets jobs onto the nodes it keeps for other pods; allow it by listing the key in spec.allow.tolerations", t.Key)))
	}
}
