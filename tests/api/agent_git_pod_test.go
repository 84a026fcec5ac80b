package api_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
)

// The pod of a job whose environment has git credentials and its own agent image is one
// the API server takes in a namespace that enforces the restricted Pod Security Standard:
// the agent's init container and the Secret volumes meet it as the rest of the pod does.
func TestAgentAndGitPodsMeetRestricted(t *testing.T) {
	ctx := context.Background()
	const restricted = "restricted-jobs"
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: restricted,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}))

	git := bkv1.GitSettings{
		SSHSecret:         &bkv1.GitSSHSecret{Name: "deploy-key", KnownHostsKey: "known_hosts"},
		CredentialsSecret: &bkv1.GitCredentialsSecret{Name: "github-token", URL: "https://github.com"},
	}
	cases := []struct {
		name  string
		set   func(*bkv1.BuildEnvironmentSpec)
		level podbuilder.PodSecurityLevel
		// refused: the API server must refuse the pod (the check that it enforces anything).
		refused string
	}{
		{name: "git credentials and the operator's agent", level: podbuilder.PodSecurityRestricted,
			set: func(s *bkv1.BuildEnvironmentSpec) { s.Git = git }},
		{name: "the environment's agent image, the job's own user", level: podbuilder.PodSecurityRestricted,
			set: func(s *bkv1.BuildEnvironmentSpec) {
				s.Git = git
				s.Agent.Image = "registry.example.com/ci/agent:3.138.1"
				s.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](2000)}
			}},
		{name: "a pod not made for the namespace", level: "",
			set:     func(s *bkv1.BuildEnvironmentSpec) { s.Git = git },
			refused: `violates PodSecurity "restricted:latest"`},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := validEnv("git-pod", gen.SetBuildEnvironmentNamespace(restricted))
			be.Name = be.Name + "-" + string(rune('a'+i))
			be.Spec.Sidecars = nil
			tc.set(&be.Spec)
			be.Spec.Allow.Secrets = []string{"deploy-key", "github-token"}
			require.NoError(t, env.Client.Create(ctx, be))

			job := gen.BuildJob("git-job", gen.SetBuildJobNamespace(restricted), gen.SetBuildJobUID("00000000-0000-4000-8000-000000000002"),
				gen.SetBuildJobEnvironment(be.Name))
			pod, err := podbuilder.Build(job, be, podbuilder.Options{AgentEndpoint: "https://agent.buildkite.com/v3", PodSecurity: tc.level})
			require.NoError(t, err)
			pod.OwnerReferences = nil // its BuildJob does not exist here
			err = env.Client.Create(ctx, pod, client.DryRunAll)
			if tc.refused != "" {
				require.Error(t, err, "the API server took a pod that breaks restricted: it enforces nothing, and the other cases prove nothing")
				assert.Contains(t, err.Error(), tc.refused)
				return
			}
			require.NoError(t, err, "the API server refuses the pod")
		})
	}
}
