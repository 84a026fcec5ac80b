package seal

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

func TestSignParts(t *testing.T) {
	k := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	assert.NotEqual(t, k.Sign("ab", "c"), k.Sign("a", "bc"), "parts are length-prefixed")
	assert.True(t, k.Verify(k.Sign("a", "b"), "a", "b"))
	assert.False(t, k.Verify(k.Sign("a", "b"), "a", "c"))
	assert.False(t, k.Verify("", "a", "b"), "no seal")
	other := NewKey([]byte("another key of thirty-two bytes!"))
	assert.False(t, other.Verify(k.Sign("a", "b"), "a", "b"), "another key's seal")
	var none *Key
	assert.False(t, none.Verify(k.Sign("a"), "a"), "no key verifies nothing")
}

// TestTokenSecret: a token Secret is the spawner's for a BuildJob only if the BuildJob
// controls it, by UID, and it holds that BuildJob's seal. Each case changes one thing an
// attacker controls.
func TestTokenSecret(t *testing.T) {
	k := NewKey([]byte("0123456789abcdef0123456789abcdef"))
	bj := &bkv1.BuildJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: bkv1.GroupVersion.String(), Kind: "BuildJob"},
		ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ci", UID: "uid-1"},
		Spec:       bkv1.BuildJobSpec{JobID: "0190f1b4-8c1e-4a6a-9d7e-3f2b1c0d9e8f"},
	}
	secret := func(uid types.UID, controller bool, seal string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "job-token-x", Namespace: "ci", OwnerReferences: []metav1.OwnerReference{{
				APIVersion: bkv1.GroupVersion.String(), Kind: "BuildJob", Name: "job", UID: uid, Controller: ptr.To(controller),
			}}},
			Data: map[string][]byte{bkv1.TokenSecretSealKey: []byte(seal)},
		}
	}
	other := bj.DeepCopy()
	other.UID, other.Spec.JobID = "uid-2", "0190f1b4-8c1e-4a6a-9d7e-000000000000"
	for _, tc := range []struct {
		name string
		sec  *corev1.Secret
		want bool
	}{
		{"the spawner's", secret("uid-1", true, k.BuildJob(bj)), true},
		{"no seal", secret("uid-1", true, ""), false},
		{"another BuildJob's seal", secret("uid-1", true, k.BuildJob(other)), false},
		{"owned by another UID of the same name", secret("uid-2", true, k.BuildJob(bj)), false},
		{"owned but not controlled", secret("uid-1", false, k.BuildJob(bj)), false},
		{"sealed with another key", secret("uid-1", true, NewKey([]byte("another key of thirty-two bytes!")).BuildJob(bj)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, k.TokenSecret(bj, tc.sec))
		})
	}
	moved := secret("uid-1", true, k.BuildJob(bj))
	moved.Namespace = "elsewhere"
	assert.False(t, k.TokenSecret(bj, moved), "a Secret of another namespace")
}
