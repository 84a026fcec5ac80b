package buildjob

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
)

// The operator's pull secrets reach the pod builder, which gives them to every job pod.
func TestPodOptionsCarryThePullSecrets(t *testing.T) {
	secrets := []corev1.LocalObjectReference{{Name: "operator-registry"}}
	assert.Equal(t, secrets, Options{ImagePullSecrets: secrets}.podOptions().ImagePullSecrets)
	assert.Empty(t, Options{}.podOptions().ImagePullSecrets)
}
