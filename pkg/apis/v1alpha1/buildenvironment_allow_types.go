package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Allow lists the privileges the pods of an environment may use. A setting that needs one
// of them is refused unless it is allowed here: by the webhook when the environment is
// written, in the environment's Ready condition, and when a job's pod is built, so that an
// environment admitted while the webhook was off still cannot use it. hostNetwork, hostPID
// and hostIPC cannot be set in a BuildEnvironment at all. A privilege follows the person who
// grants it: writing an environment that allows anything needs the verb grant on
// buildenvironments, as well as get on each Secret listed and create on the token of its
// service account (the webhook asks the API server).
type Allow struct {
	// Privileged lets containers run privileged, with every device and capability of the
	// node, with an unmasked /proc (procMount: Unmasked), or with SELinux options beyond a
	// confined container type (an SELinux user or role, or a type such as spc_t).
	// +optional
	Privileged bool `json:"privileged,omitempty"`
	// PrivilegeEscalation lets containers set allowPrivilegeEscalation: true.
	// +optional
	PrivilegeEscalation bool `json:"privilegeEscalation,omitempty"`
	// RunAsRoot lets the pod or its containers set runAsUser: 0.
	// +optional
	RunAsRoot bool `json:"runAsRoot,omitempty"`
	// HostPath lets the pod mount hostPath volumes: the node's files.
	// +optional
	HostPath bool `json:"hostPath,omitempty"`
	// HostPorts lets containers bind ports on the node's network (ports[].hostPort).
	// +optional
	HostPorts bool `json:"hostPorts,omitempty"`
	// Unconfined lets the pod or its containers run with a seccomp or AppArmor profile
	// other than RuntimeDefault or Localhost, such as Unconfined.
	// +optional
	Unconfined bool `json:"unconfined,omitempty"`
	// Capabilities containers may add beyond the runtime's default set (AUDIT_WRITE,
	// CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID,
	// SETPCAP, SETUID, SYS_CHROOT, which need no entry), such as SYS_PTRACE or NET_ADMIN.
	// ALL allows any.
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +optional
	Capabilities []corev1.Capability `json:"capabilities,omitempty"`
	// Secrets are the names of the Secrets, in the environment's namespace, that its
	// containers' env and envFrom and its volumes (secret, projected, and the secretRef of
	// csi, azureFile, cephfs, cinder, flexVolume, iscsi, rbd, scaleIO and storageos) may
	// refer to. Jobs can read every Secret listed.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Secrets []string `json:"secrets,omitempty"`
	// Sysctls the pod may set (spec.podSecurityContext.sysctls) beyond those Kubernetes
	// counts safe for any pod (kernel.shm_rmid_forced, net.ipv4.ip_local_port_range,
	// net.ipv4.ip_local_reserved_ports, net.ipv4.ip_unprivileged_port_start,
	// net.ipv4.ping_group_range, net.ipv4.tcp_syncookies, net.ipv4.tcp_keepalive_time,
	// net.ipv4.tcp_keepalive_intvl, net.ipv4.tcp_keepalive_probes, net.ipv4.tcp_fin_timeout,
	// net.ipv4.tcp_rmem and net.ipv4.tcp_wmem, which need no entry). The kubelet must allow
	// them too (--allowed-unsafe-sysctls).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Sysctls []string `json:"sysctls,omitempty"`
	// ServiceAccount lets the pod run as spec.serviceAccountName and give its containers
	// a Kubernetes API token (spec.automountServiceAccountToken, or a projected
	// serviceAccountToken volume). Without it job pods get no Kubernetes API access.
	// +optional
	ServiceAccount bool `json:"serviceAccount,omitempty"`
	// PersistentVolumeClaims are the names of the PersistentVolumeClaims, in the
	// environment's namespace, that its volumes may mount (persistentVolumeClaim.claimName):
	// a claim holds whatever the workloads that share it wrote there, and jobs can read and
	// change all of it. Ephemeral volumes and a workspace volumeClaimTemplate need no entry:
	// each makes a claim of the pod's own.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	PersistentVolumeClaims []string `json:"persistentVolumeClaims,omitempty"`
	// PriorityClasses are the PriorityClasses the pod may name in spec.priorityClassName:
	// a priority above other pods' lets jobs preempt them, evicting them from their nodes.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	PriorityClasses []string `json:"priorityClasses,omitempty"`
	// Tolerations are the keys of the node taints the pod may tolerate (spec.tolerations);
	// "*" lets it tolerate every taint (a toleration with an empty key and operator
	// Exists), and so run on any node, the control plane's included. Keys, not whole
	// tolerations: a taint's key is what keeps a set of nodes (a node pool, the control
	// plane, GPUs) for some pods, and a toleration of the key, whatever its value and
	// effect, is what lets a pod onto them. The node.kubernetes.io/not-ready and
	// node.kubernetes.io/unreachable taints, which Kubernetes has every pod tolerate for a
	// while, need no entry.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=317
	// +listType=set
	// +optional
	Tolerations []string `json:"tolerations,omitempty"`
}
