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

// DefaultCapabilities are the capabilities a container may add without an allow: those
// container runtimes give every container by default, less NET_RAW (the Pod Security
// Standards' baseline list).
var DefaultCapabilities = []corev1.Capability{
	"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
	"NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}

// SafeSysctls are the sysctls any pod may set without an allow: those Kubernetes counts
// safe, namespaced to the pod and unable to affect the node or other pods.
var SafeSysctls = []string{
	"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_local_reserved_ports",
	"net.ipv4.ip_unprivileged_port_start", "net.ipv4.ping_group_range", "net.ipv4.tcp_syncookies",
	"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
	"net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
}

// confinedSELinuxTypes are the SELinux types a container may ask for without an allow: the
// container policies' confined types. Any other (spc_t, a super-privileged container, or a
// host type) can lift the confinement that keeps a container off the node.
var confinedSELinuxTypes = []string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}

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

func (c *privilegeCheck) container(p *field.Path, sc *corev1.SecurityContext, env []corev1.EnvVar, envFrom []corev1.EnvFromSource, ports []corev1.ContainerPort) {
	if sc != nil {
		scp := p.Child("securityContext")
		if sc.Privileged != nil && *sc.Privileged {
			c.deny(c.allow.Privileged, scp.Child("privileged"), privilegedWhy, "privileged")
		}
		// Anything but Default, not only Unmasked: Pod Security reads any other value as
		// unmasked.
		if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
			c.deny(c.allow.Privileged, scp.Child("procMount"), "an unmasked /proc shows the node's kernel settings to the container", "privileged")
		}
		if sc.WindowsOptions != nil && sc.WindowsOptions.HostProcess != nil && *sc.WindowsOptions.HostProcess {
			c.deny(c.allow.Privileged, scp.Child("windowsOptions", "hostProcess"), "a host process runs on the node itself", "privileged")
		}
		if sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation {
			c.deny(c.allow.PrivilegeEscalation, scp.Child("allowPrivilegeEscalation"),
				"lets processes gain privileges their parent does not have, through setuid programs", "privilegeEscalation")
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			c.deny(c.allow.RunAsRoot, scp.Child("runAsUser"), asRoot, "runAsRoot")
		}
		c.profiles(scp, sc.SeccompProfile, sc.AppArmorProfile)
		c.seLinux(scp, sc.SELinuxOptions)
		if sc.Capabilities != nil {
			for i, capability := range sc.Capabilities.Add {
				name := CapabilityName(capability)
				if !slices.Contains(DefaultCapabilities, corev1.Capability(name)) {
					c.use("capability " + name)
				}
				if !c.capabilityAllowed(name) {
					c.errs = append(c.errs, field.Forbidden(scp.Child("capabilities", "add").Index(i), fmt.Sprintf(
						"capability %s is beyond the container runtime's default set; allow it by listing it in spec.allow.capabilities", name)))
				}
			}
		}
	}
	for i, port := range ports {
		if port.HostPort != 0 {
			c.deny(c.allow.HostPorts, p.Child("ports").Index(i).Child("hostPort"), "binds a port of the node's network", "hostPorts")
		}
	}
	for i, e := range env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			c.secret(p.Child("env").Index(i).Child("valueFrom", "secretKeyRef", "name"), e.ValueFrom.SecretKeyRef.Name)
		}
	}
	for i, e := range envFrom {
		if e.SecretRef != nil {
			c.secret(p.Child("envFrom").Index(i).Child("secretRef", "name"), e.SecretRef.Name)
		}
	}
}

func (c *privilegeCheck) pod(p *field.Path, sc *corev1.PodSecurityContext) {
	if sc == nil {
		return
	}
	if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		c.deny(c.allow.RunAsRoot, p.Child("runAsUser"), asRoot, "runAsRoot")
	}
	if sc.WindowsOptions != nil && sc.WindowsOptions.HostProcess != nil && *sc.WindowsOptions.HostProcess {
		c.deny(c.allow.Privileged, p.Child("windowsOptions", "hostProcess"), "a host process runs on the node itself", "privileged")
	}
	c.profiles(p, sc.SeccompProfile, sc.AppArmorProfile)
	c.seLinux(p, sc.SELinuxOptions)
	for i, sysctl := range sc.Sysctls {
		if slices.Contains(SafeSysctls, sysctl.Name) {
			continue
		}
		c.use("sysctl " + sysctl.Name)
		if !slices.Contains(c.allow.Sysctls, sysctl.Name) {
			c.errs = append(c.errs, field.Forbidden(p.Child("sysctls").Index(i).Child("name"), fmt.Sprintf(
				"sysctl %s is not one Kubernetes counts safe for any pod; allow it by listing it in spec.allow.sysctls (the kubelet must allow it too)", sysctl.Name)))
		}
	}
}

// seLinux reports SELinux options that may lift a container's confinement: a user, a role,
// or a type other than the confined container types.
func (c *privilegeCheck) seLinux(p *field.Path, o *corev1.SELinuxOptions) {
	if o == nil {
		return
	}
	sp := p.Child("seLinuxOptions")
	if o.User != "" {
		c.deny(c.allow.Privileged, sp.Child("user"), fmt.Sprintf("sets the SELinux user %q, which may lift the container's confinement", o.User), "privileged")
	}
	if o.Role != "" {
		c.deny(c.allow.Privileged, sp.Child("role"), fmt.Sprintf("sets the SELinux role %q, which may lift the container's confinement", o.Role), "privileged")
	}
	if !slices.Contains(confinedSELinuxTypes, o.Type) {
		c.deny(c.allow.Privileged, sp.Child("type"), fmt.Sprintf(
			"SELinux type %q is not a confined container type (container_t, container_init_t, container_kvm_t, container_engine_t) and may reach the node", o.Type), "privileged")
	}
}

// profiles reports seccomp and AppArmor profiles other than the runtime's default or one on
// the node: Unconfined, and any other value, which Pod Security reads as unconfined.
func (c *privilegeCheck) profiles(p *field.Path, seccomp *corev1.SeccompProfile, appArmor *corev1.AppArmorProfile) {
	if seccomp != nil && seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost {
		c.deny(c.allow.Unconfined, p.Child("seccompProfile", "type"), noSeccomp, "unconfined")
	}
	if appArmor != nil && appArmor.Type != corev1.AppArmorProfileTypeRuntimeDefault && appArmor.Type != corev1.AppArmorProfileTypeLocalhost {
		c.deny(c.allow.Unconfined, p.Child("appArmorProfile", "type"), noAppArmor, "unconfined")
	}
}

// volume reports the volume sources that give jobs what is not theirs: the node's files, a
// Secret (every source that names one: the kubelet or the volume's driver reads it for the
// pod, and a driver may hand its contents to the pod), a token of the pod's service account,
// and a claim other workloads may share.
func (c *privilegeCheck) volume(p *field.Path, v *corev1.Volume) {
	switch {
	case v.HostPath != nil:
		c.use(usesOf["hostPath"])
		if !c.allow.HostPath {
			c.errs = append(c.errs, field.Forbidden(p.Child("hostPath"),
				"hostPath volumes give jobs the node's files; allow them with spec.allow.hostPath: true"))
		}
	case v.Secret != nil:
		c.secret(p.Child("secret", "secretName"), v.Secret.SecretName)
	case v.Projected != nil:
		for i, src := range v.Projected.Sources {
			sp := p.Child("projected", "sources").Index(i)
			if src.Secret != nil {
				c.secret(sp.Child("secret", "name"), src.Secret.Name)
			}
			if src.ServiceAccountToken != nil {
				c.deny(c.allow.ServiceAccount, sp.Child("serviceAccountToken"), apiToken, "serviceAccount")
			}
		}
	case v.PersistentVolumeClaim != nil:
		name := v.PersistentVolumeClaim.ClaimName
		c.use(fmt.Sprintf("PersistentVolumeClaim %q", name))
		if !slices.Contains(c.allow.PersistentVolumeClaims, name) {
			c.errs = append(c.errs, field.Forbidden(p.Child("persistentVolumeClaim", "claimName"), fmt.Sprintf(
				"PersistentVolumeClaim %q holds what other workloads wrote there, for jobs to read and change; allow it by listing it in spec.allow.persistentVolumeClaims", name)))
		}
	case v.CSI != nil && v.CSI.NodePublishSecretRef != nil:
		c.secret(p.Child("csi", "nodePublishSecretRef", "name"), v.CSI.NodePublishSecretRef.Name)
	case v.AzureFile != nil:
		c.secret(p.Child("azureFile", "secretName"), v.AzureFile.SecretName)
	case v.CephFS != nil && v.CephFS.SecretRef != nil:
		c.secret(p.Child("cephfs", "secretRef", "name"), v.CephFS.SecretRef.Name)
	case v.Cinder != nil && v.Cinder.SecretRef != nil:
		c.secret(p.Child("cinder", "secretRef", "name"), v.Cinder.SecretRef.Name)
	case v.FlexVolume != nil && v.FlexVolume.SecretRef != nil:
		c.secret(p.Child("flexVolume", "secretRef", "name"), v.FlexVolume.SecretRef.Name)
	case v.ISCSI != nil && v.ISCSI.SecretRef != nil:
		c.secret(p.Child("iscsi", "secretRef", "name"), v.ISCSI.SecretRef.Name)
	case v.RBD != nil && v.RBD.SecretRef != nil:
		c.secret(p.Child("rbd", "secretRef", "name"), v.RBD.SecretRef.Name)
	case v.ScaleIO != nil && v.ScaleIO.SecretRef != nil:
		c.secret(p.Child("scaleIO", "secretRef", "name"), v.ScaleIO.SecretRef.Name)
	case v.StorageOS != nil && v.StorageOS.SecretRef != nil:
		c.secret(p.Child("storageos", "secretRef", "name"), v.StorageOS.SecretRef.Name)
	}
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

func (c *privilegeCheck) capabilityAllowed(name string) bool {
	if slices.Contains(DefaultCapabilities, corev1.Capability(name)) {
		return true
	}
	for _, a := range c.allow.Capabilities {
		if n := CapabilityName(a); n == "ALL" || n == name {
			return true
		}
	}
	return false
}

// CapabilityName is a capability as the runtimes read it: upper case, without CAP_.
func CapabilityName(c corev1.Capability) string {
	return strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
}
