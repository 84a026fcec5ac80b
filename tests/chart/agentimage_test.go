package chart

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

// The agent image reaches the operator from agentImage: by default the operator's own
// default, which the tests' local node has under the same reference (tests/images), so an
// install with the default values runs jobs there unchanged.
func TestAgentImage(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		wantImage  string
		wantPolicy string
	}{
		{name: "default", wantImage: podbuilder.DefaultAgentImage, wantPolicy: "IfNotPresent"},
		{name: "a mirror, pinned by digest", args: []string{
			"--set", "agentImage.repository=registry.example.com:5000/mirror/buildkite-agent",
			"--set", "agentImage.tag=3.138.1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			"--set", "agentImage.pullPolicy=Always",
		}, wantImage: "registry.example.com:5000/mirror/buildkite-agent:3.138.1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", wantPolicy: "Always"},
		{name: "agentImage.digest, the tag ignored", args: []string{
			"--set", "agentImage.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		}, wantImage: "buildkite/agent@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", wantPolicy: "IfNotPresent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := byKind[appsv1.Deployment](t, render(t, tc.args...), "Deployment")
			require.Len(t, d, 1)
			args := d[0].Spec.Template.Spec.Containers[0].Args
			assert.Contains(t, args, "--agent-image="+tc.wantImage)
			assert.Contains(t, args, "--agent-image-pull-policy="+tc.wantPolicy)
		})
	}
	assert.Equal(t, podbuilder.DefaultAgentImage, images.AgentImage, "the local node's agent image is not the chart's default")
}

// A value the kubelet could not use is refused by helm, with the value's path.
func TestAgentImageValuesRefused(t *testing.T) {
	for _, tc := range []struct {
		name, set, want string
	}{
		{"no tag", "agentImage.tag=", "/agentImage/tag"},
		{"a space in the repository", "agentImage.repository=buildkite agent", "/agentImage/repository"},
		{"an unknown pull policy", "agentImage.pullPolicy=Sometimes", "/agentImage/pullPolicy"},
		{"a digest too short", "agentImage.digest=sha256:0123", "/agentImage/digest"},
		{"a digest of another algorithm", "agentImage.digest=sha512:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "/agentImage/digest"},
		{"a digest in capitals", "image.digest=sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", "/image/digest"},
		{"a digest without its algorithm", "image.digest=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "/image/digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set", tc.set).CombinedOutput()
			require.Error(t, err, "helm accepted %s", tc.set)
			assert.Contains(t, string(out), tc.want)
		})
	}
}
