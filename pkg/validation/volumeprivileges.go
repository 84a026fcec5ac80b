package validation

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

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
