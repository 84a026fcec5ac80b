package seal

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// BuildJob is the seal the spawner puts in the token Secret of a BuildJob it made
// (bkv1.TokenSecretSealKey). It binds the Buildkite job to the BuildJob's UID: a BuildJob
// made by anyone else, or made again under the same name, has another UID, and its spec
// cannot change (the CRD makes it immutable), so the seal covers what the job runs.
func (k *Key) BuildJob(bj *bkv1.BuildJob) string {
	return k.Sign("BuildJob/v1", bj.Namespace, bj.Name, string(bj.UID), bj.Spec.JobID)
}

// TokenSecret reports whether sec is the token Secret the spawner made for bj: controlled
// by bj (by UID, not by name) and holding bj's seal. Only then may the job token in it be
// used for bj, by the controller or by bj's pod.
func (k *Key) TokenSecret(bj *bkv1.BuildJob, sec *corev1.Secret) bool {
	owner := metav1.GetControllerOf(sec)
	if k == nil || owner == nil || owner.UID != bj.UID || bj.UID == "" || sec.Namespace != bj.Namespace {
		return false
	}
	return k.Verify(string(sec.Data[bkv1.TokenSecretSealKey]), "BuildJob/v1", bj.Namespace, bj.Name, string(bj.UID), bj.Spec.JobID)
}
