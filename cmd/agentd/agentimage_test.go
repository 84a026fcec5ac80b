package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
)

// The agent's image comes from --agent-image or its variable, Buildkite's own by default,
// and a reference or pull policy the kubelet would refuse stops the operator at once.
func TestAgentImageFlags(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		env        map[string]string
		wantImage  string
		wantPolicy corev1.PullPolicy
		wantErr    string
	}{
		{name: "defaults", wantImage: podbuilder.DefaultAgentImage, wantPolicy: corev1.PullIfNotPresent},
		{name: "from the variables", env: map[string]string{
			"BK_OPERATOR_AGENT_IMAGE": "registry.example.com/buildkite/agent:3.138.1", "BK_OPERATOR_AGENT_IMAGE_PULL_POLICY": "Always"},
			wantImage: "registry.example.com/buildkite/agent:3.138.1", wantPolicy: corev1.PullAlways},
		{name: "the flag wins", args: []string{"--agent-image", "buildkite/agent:3.138.1-ubuntu-24.04"},
			env:       map[string]string{"BK_OPERATOR_AGENT_IMAGE": "registry.example.com/buildkite/agent:3.138.1"},
			wantImage: "buildkite/agent:3.138.1-ubuntu-24.04", wantPolicy: corev1.PullIfNotPresent},
		{name: "no image reference", args: []string{"--agent-image", "Buildkite Agent"},
			wantErr: `invalid value "Buildkite Agent" for flag -agent-image: image "Buildkite Agent": invalid reference format`},
		{name: "no pull policy", env: map[string]string{"BK_OPERATOR_AGENT_IMAGE_PULL_POLICY": "ifnotpresent"},
			wantErr: `pull policy "ifnotpresent": use Always, IfNotPresent or Never`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c operatorConfig
			err := flagenv.ParseEnv(c.flags(), tc.args, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantImage, c.controller.AgentImage)
			assert.Equal(t, tc.wantPolicy, c.controller.AgentImagePullPolicy)
		})
	}
}
