package validation

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
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

// container reports what a container's security context, ports, env and envFrom (p is the
// container, or spec for the command container) use beyond a plain confined container.
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

// pod reports what the pod's security context (p) uses beyond a plain confined pod: root,
// host processes, unconfined profiles, SELinux options and unsafe sysctls.
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
