// Package validationtest holds the table of privilege rules that the validation, webhook
// and pod builder tests share, so that all three check the same rules the same way.
package validationtest

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// PrivilegeCase is one setting that needs a privilege: Set puts it into an otherwise valid
// environment, Want is the only error validation.Privileges reports for it, and Allow
// lets it.
type PrivilegeCase struct {
	Name  string
	Set   func(*bkv1.BuildEnvironment)
	Allow func(*bkv1.Allow)
	Want  string
}

func sidecar(sc *corev1.SecurityContext) func(*bkv1.BuildEnvironment) {
	return func(e *bkv1.BuildEnvironment) {
		e.Spec.Sidecars = append(e.Spec.Sidecars, corev1.Container{Name: "helper", Image: "busybox:1.37", SecurityContext: sc})
	}
}

func volume(src corev1.VolumeSource) func(*bkv1.BuildEnvironment) {
	return func(e *bkv1.BuildEnvironment) {
		e.Spec.Volumes = append(e.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: src})
	}
}

func secretEnv(name string) corev1.EnvVar {
	return corev1.EnvVar{Name: "DB_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "password",
	}}}
}

func allowSecret(name string) func(*bkv1.Allow) {
	return func(a *bkv1.Allow) { a.Secrets = append(a.Secrets, "other", name) }
}

// secretVolume is the case of a volume source that names a Secret at field (under the
// volume) for its driver or the kubelet to read.
func secretVolume(name, field, secret string, src corev1.VolumeSource) PrivilegeCase {
	return PrivilegeCase{
		Name:  "Secret in a volume: " + name,
		Set:   volume(src),
		Allow: allowSecret(secret),
		Want:  `spec.volumes[0].` + field + `: Forbidden: Secret "` + secret + `" is not in spec.allow.secrets; list it there to let jobs read it`,
	}
}

// PrivilegeCases are the settings that need an allow in the BuildEnvironment.
// shape: table-only: the privilege cases, one row each; their closures only set the setting
func PrivilegeCases() []PrivilegeCase {
	return []PrivilegeCase{
		{
			Name: "privileged job container",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
			},
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.securityContext.privileged: Forbidden: a privileged container can reach the node and every pod on it; allow it with spec.allow.privileged: true`,
		},
		{
			Name: "privileged init container",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.InitContainers = []corev1.Container{{Name: "sysctl", Image: "busybox:1.37", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
			},
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.initContainers[0].securityContext.privileged: Forbidden: a privileged container can reach the node and every pod on it; allow it with spec.allow.privileged: true`,
		},
		{
			Name:  "unmasked /proc",
			Set:   sidecar(&corev1.SecurityContext{ProcMount: ptr.To(corev1.UnmaskedProcMount)}),
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.sidecars[0].securityContext.procMount: Forbidden: an unmasked /proc shows the node's kernel settings to the container; allow it with spec.allow.privileged: true`,
		},
		{
			Name: "Windows host process",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.PodSecurityContext = &corev1.PodSecurityContext{WindowsOptions: &corev1.WindowsSecurityContextOptions{HostProcess: ptr.To(true)}}
			},
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.podSecurityContext.windowsOptions.hostProcess: Forbidden: a host process runs on the node itself; allow it with spec.allow.privileged: true`,
		},
		{
			Name:  "SELinux type spc_t",
			Set:   sidecar(&corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t"}}),
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.sidecars[0].securityContext.seLinuxOptions.type: Forbidden: SELinux type "spc_t" is not a confined container type (container_t, container_init_t, container_kvm_t, container_engine_t) and may reach the node; allow it with spec.allow.privileged: true`,
		},
		{
			Name: "SELinux user for the pod",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.PodSecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{User: "system_u", Type: "container_t"}}
			},
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.podSecurityContext.seLinuxOptions.user: Forbidden: sets the SELinux user "system_u", which may lift the container's confinement; allow it with spec.allow.privileged: true`,
		},
		{
			Name: "SELinux role for the job container",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Role: "sysadm_r"}}
			},
			Allow: func(a *bkv1.Allow) { a.Privileged = true },
			Want:  `spec.securityContext.seLinuxOptions.role: Forbidden: sets the SELinux role "sysadm_r", which may lift the container's confinement; allow it with spec.allow.privileged: true`,
		},
		{
			Name: "unsafe sysctl",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.PodSecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
					{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}, {Name: "kernel.msgmax", Value: "65536"}}}
			},
			Allow: func(a *bkv1.Allow) { a.Sysctls = []string{"kernel.msgmax"} },
			Want:  `spec.podSecurityContext.sysctls[1].name: Forbidden: sysctl kernel.msgmax is not one Kubernetes counts safe for any pod; allow it by listing it in spec.allow.sysctls (the kubelet must allow it too)`,
		},
		{
			Name:  "allowPrivilegeEscalation",
			Set:   sidecar(&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)}),
			Allow: func(a *bkv1.Allow) { a.PrivilegeEscalation = true },
			Want:  `spec.sidecars[0].securityContext.allowPrivilegeEscalation: Forbidden: lets processes gain privileges their parent does not have, through setuid programs; allow it with spec.allow.privilegeEscalation: true`,
		},
		{
			Name: "runAsUser 0 for the pod",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.PodSecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}
			},
			Allow: func(a *bkv1.Allow) { a.RunAsRoot = true },
			Want:  `spec.podSecurityContext.runAsUser: Forbidden: runs as root (uid 0); allow it with spec.allow.runAsRoot: true`,
		},
		{
			Name: "runAsUser 0 for the job container",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
			},
			Allow: func(a *bkv1.Allow) { a.RunAsRoot = true },
			Want:  `spec.securityContext.runAsUser: Forbidden: runs as root (uid 0); allow it with spec.allow.runAsRoot: true`,
		},
		{
			Name:  "hostPath volume",
			Set:   volume(corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run"}}),
			Allow: func(a *bkv1.Allow) { a.HostPath = true },
			Want:  `spec.volumes[0].hostPath: Forbidden: hostPath volumes give jobs the node's files; allow them with spec.allow.hostPath: true`,
		},
		{
			Name: "hostPort",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", Ports: []corev1.ContainerPort{{ContainerPort: 5432, HostPort: 5432}}}}
			},
			Allow: func(a *bkv1.Allow) { a.HostPorts = true },
			Want:  `spec.sidecars[0].ports[0].hostPort: Forbidden: binds a port of the node's network; allow it with spec.allow.hostPorts: true`,
		},
		{
			Name: "seccomp Unconfined for the pod",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.PodSecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
			},
			Allow: func(a *bkv1.Allow) { a.Unconfined = true },
			Want:  `spec.podSecurityContext.seccompProfile.type: Forbidden: runs without a seccomp filter, with every system call open; allow it with spec.allow.unconfined: true`,
		},
		{
			Name:  "seccomp Unconfined for a container",
			Set:   sidecar(&corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}),
			Allow: func(a *bkv1.Allow) { a.Unconfined = true },
			Want:  `spec.sidecars[0].securityContext.seccompProfile.type: Forbidden: runs without a seccomp filter, with every system call open; allow it with spec.allow.unconfined: true`,
		},
		{
			Name: "AppArmor Unconfined",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}}
			},
			Allow: func(a *bkv1.Allow) { a.Unconfined = true },
			Want:  `spec.securityContext.appArmorProfile.type: Forbidden: runs without an AppArmor profile; allow it with spec.allow.unconfined: true`,
		},
		{
			Name: "AppArmor unconfined by annotation",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.PodAnnotations = map[string]string{"container.apparmor.security.beta.kubernetes.io/job": "unconfined"}
			},
			Allow: func(a *bkv1.Allow) { a.Unconfined = true },
			Want:  `spec.podAnnotations[container.apparmor.security.beta.kubernetes.io/job]: Forbidden: runs without an AppArmor profile; allow it with spec.allow.unconfined: true`,
		},
		{
			Name: "capability beyond the default set",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "CAP_SYS_ADMIN"}}}
			},
			Allow: func(a *bkv1.Allow) { a.Capabilities = []corev1.Capability{"SYS_ADMIN"} },
			Want:  `spec.securityContext.capabilities.add[1]: Forbidden: capability SYS_ADMIN is beyond the container runtime's default set; allow it by listing it in spec.allow.capabilities`,
		},
		{
			Name:  "capability ALL",
			Set:   sidecar(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"all"}}}),
			Allow: func(a *bkv1.Allow) { a.Capabilities = []corev1.Capability{"ALL"} },
			Want:  `spec.sidecars[0].securityContext.capabilities.add[0]: Forbidden: capability ALL is beyond the container runtime's default set; allow it by listing it in spec.allow.capabilities`,
		},
		{
			Name:  "Secret in env",
			Set:   func(e *bkv1.BuildEnvironment) { e.Spec.Env = []corev1.EnvVar{{Name: "A", Value: "1"}, secretEnv("db")} },
			Allow: allowSecret("db"),
			Want:  `spec.env[1].valueFrom.secretKeyRef.name: Forbidden: Secret "db" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
		{
			Name: "Secret in a sidecar's env",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Sidecars = []corev1.Container{{Name: "db", Image: "postgres:17", Env: []corev1.EnvVar{secretEnv("postgres")}}}
			},
			Allow: allowSecret("postgres"),
			Want:  `spec.sidecars[0].env[0].valueFrom.secretKeyRef.name: Forbidden: Secret "postgres" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
		{
			Name: "Secret in envFrom",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "registration"}}}}
			},
			Allow: allowSecret("registration"),
			Want:  `spec.envFrom[0].secretRef.name: Forbidden: Secret "registration" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
		{
			Name:  "Secret volume",
			Set:   volume(corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "ssh-key"}}),
			Allow: allowSecret("ssh-key"),
			Want:  `spec.volumes[0].secret.secretName: Forbidden: Secret "ssh-key" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
		{
			Name: "Secret in a projected volume",
			Set: volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "npmrc"}}},
			}}}),
			Allow: allowSecret("npmrc"),
			Want:  `spec.volumes[0].projected.sources[0].secret.name: Forbidden: Secret "npmrc" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
		secretVolume("CSI nodePublishSecretRef", "csi.nodePublishSecretRef.name", "csi-creds", corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: "secrets-store.csi.k8s.io", NodePublishSecretRef: &corev1.LocalObjectReference{Name: "csi-creds"},
		}}),
		secretVolume("azureFile secretName", "azureFile.secretName", "azure-storage", corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{
			SecretName: "azure-storage", ShareName: "builds",
		}}),
		secretVolume("cephfs secretRef", "cephfs.secretRef.name", "ceph", corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{
			Monitors: []string{"10.0.0.1:6789"}, SecretRef: &corev1.LocalObjectReference{Name: "ceph"},
		}}),
		secretVolume("cinder secretRef", "cinder.secretRef.name", "openstack", corev1.VolumeSource{Cinder: &corev1.CinderVolumeSource{
			VolumeID: "vol", SecretRef: &corev1.LocalObjectReference{Name: "openstack"},
		}}),
		secretVolume("flexVolume secretRef", "flexVolume.secretRef.name", "flex", corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{
			Driver: "example.com/flex", SecretRef: &corev1.LocalObjectReference{Name: "flex"},
		}}),
		secretVolume("iscsi secretRef", "iscsi.secretRef.name", "chap", corev1.VolumeSource{ISCSI: &corev1.ISCSIVolumeSource{
			TargetPortal: "10.0.0.2:3260", IQN: "iqn.2001-04.com.example:storage", SecretRef: &corev1.LocalObjectReference{Name: "chap"},
		}}),
		secretVolume("rbd secretRef", "rbd.secretRef.name", "ceph-rbd", corev1.VolumeSource{RBD: &corev1.RBDVolumeSource{
			CephMonitors: []string{"10.0.0.1:6789"}, RBDImage: "builds", SecretRef: &corev1.LocalObjectReference{Name: "ceph-rbd"},
		}}),
		secretVolume("scaleIO secretRef", "scaleIO.secretRef.name", "scaleio", corev1.VolumeSource{ScaleIO: &corev1.ScaleIOVolumeSource{
			Gateway: "https://scaleio.example.com", System: "sys", SecretRef: &corev1.LocalObjectReference{Name: "scaleio"},
		}}),
		secretVolume("storageos secretRef", "storageos.secretRef.name", "storageos", corev1.VolumeSource{StorageOS: &corev1.StorageOSVolumeSource{
			VolumeName: "builds", SecretRef: &corev1.LocalObjectReference{Name: "storageos"},
		}}),
		{
			Name: "another workload's PersistentVolumeClaim",
			Set: volume(corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
				ClaimName: "payments-db-data",
			}}),
			Allow: func(a *bkv1.Allow) { a.PersistentVolumeClaims = []string{"cache", "payments-db-data"} },
			Want:  `spec.volumes[0].persistentVolumeClaim.claimName: Forbidden: PersistentVolumeClaim "payments-db-data" holds what other workloads wrote there, for jobs to read and change; allow it by listing it in spec.allow.persistentVolumeClaims`,
		},
		{
			Name:  "priority class",
			Set:   func(e *bkv1.BuildEnvironment) { e.Spec.PriorityClassName = "production-critical" },
			Allow: func(a *bkv1.Allow) { a.PriorityClasses = []string{"production-critical"} },
			Want:  `spec.priorityClassName: Forbidden: priority class "production-critical" may let jobs preempt other pods of the cluster; allow it by listing it in spec.allow.priorityClasses`,
		},
		{
			Name: "toleration of a taint",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Tolerations = []corev1.Toleration{
					{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](30)},
					{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
				}
			},
			Allow: func(a *bkv1.Allow) { a.Tolerations = []string{"node-role.kubernetes.io/control-plane"} },
			Want:  `spec.tolerations[1].key: Forbidden: tolerating taint "node-role.kubernetes.io/control-plane" lets jobs onto the nodes it keeps for other pods; allow it by listing the key in spec.allow.tolerations`,
		},
		{
			Name: "tolerate every taint",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			},
			Allow: func(a *bkv1.Allow) { a.Tolerations = []string{"*"} },
			Want:  `spec.tolerations[0].key: Forbidden: an empty key tolerates every taint, letting jobs onto any node, the control plane's included; allow it by listing "*" in spec.allow.tolerations`,
		},
		{
			Name:  "service account",
			Set:   func(e *bkv1.BuildEnvironment) { e.Spec.ServiceAccountName = "deployer" },
			Allow: func(a *bkv1.Allow) { a.ServiceAccount = true },
			Want:  `spec.serviceAccountName: Forbidden: runs the pods as service account "deployer", with whatever it may do in the cluster; allow it with spec.allow.serviceAccount: true`,
		},
		{
			Name:  "service account token",
			Set:   func(e *bkv1.BuildEnvironment) { e.Spec.AutomountServiceAccountToken = true },
			Allow: func(a *bkv1.Allow) { a.ServiceAccount = true },
			Want:  `spec.automountServiceAccountToken: Forbidden: gives jobs a Kubernetes API token; allow it with spec.allow.serviceAccount: true`,
		},
		{
			Name: "projected service account token",
			Set: volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}},
			}}}),
			Allow: func(a *bkv1.Allow) { a.ServiceAccount = true },
			Want:  `spec.volumes[0].projected.sources[0].serviceAccountToken: Forbidden: gives jobs a Kubernetes API token; allow it with spec.allow.serviceAccount: true`,
		},
		{
			// The checkout's SSH key is mounted into the job's container: jobs can read it.
			Name: "git SSH key",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Git.SSHSecret = &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"}
			},
			Allow: allowSecret("deploy-key"),
			Want:  `spec.git.sshSecret.name: Forbidden: Secret "deploy-key" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
		{
			Name: "git https credentials",
			Set: func(e *bkv1.BuildEnvironment) {
				e.Spec.Git.CredentialsSecret = &bkv1.GitCredentialsSecret{Name: "github-token", URL: "https://github.com"}
			},
			Allow: allowSecret("github-token"),
			Want:  `spec.git.credentialsSecret.name: Forbidden: Secret "github-token" is not in spec.allow.secrets; list it there to let jobs read it`,
		},
	}
}
