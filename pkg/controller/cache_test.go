package controller

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// TestTrimTokenSecret: the cached token Secret keeps the token and what its events need
// (its owner: Setup's Owns enqueues the BuildJob from it), and nothing else of the Secret.
func TestTrimTokenSecret(t *testing.T) {
	yes := true
	owner := metav1.OwnerReference{APIVersion: bkv1.GroupVersion.String(), Kind: "BuildJob", Name: "j", UID: "u", Controller: &yes}
	in := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "j-token", Namespace: "ns", Labels: map[string]string{bkv1.LabelJob: "j"},
			OwnerReferences: []metav1.OwnerReference{owner},
			Annotations:     map[string]string{"a": "b"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "spawner"}},
		},
		Data: map[string][]byte{bkv1.DefaultSecretKey: []byte("bkaj_x"), "env-DB_PASSWORD": []byte("hunter2")},
	}
	out, err := trimTokenSecret(in)
	require.NoError(t, err)
	s := out.(*corev1.Secret)
	assert.Equal(t, map[string][]byte{bkv1.DefaultSecretKey: []byte("bkaj_x")}, s.Data, "the token only: the job's env stays out of the operator's memory")
	assert.Equal(t, []metav1.OwnerReference{owner}, s.OwnerReferences)
	assert.Equal(t, in.Labels, s.Labels)
	assert.Empty(t, s.Annotations)
	assert.Empty(t, s.ManagedFields)
}
