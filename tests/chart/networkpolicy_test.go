package chart

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// rule is one ingress rule of a NetworkPolicy, reduced to what the tests compare: the
// ports it opens and who it lets in.
type rule struct {
	ports []int32
	from  []networkingv1.NetworkPolicyPeer
}

func rules(np networkingv1.NetworkPolicy) []rule {
	out := []rule{}
	for _, r := range np.Spec.Ingress {
		var ports []int32
		for _, p := range r.Ports {
			ports = append(ports, p.Port.IntVal)
		}
		out = append(out, rule{ports: ports, from: r.From})
	}
	return out
}

func cidr(block string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: block, Except: except}}
}

// allButJobs is the peer that admits every pod of every namespace but the job namespace.
var allButJobs = networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
	{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"buildkite-jobs"}},
}}}

// warmPods is the peer that admits the warm pods of the job namespace to the webhook port,
// where the hand-off endpoint is served.
var warmPods = rule{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{{
	NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "buildkite-jobs"}},
	PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "buildkite-operator.dev/warm-pool", Operator: metav1.LabelSelectorOpExists},
	}},
}}}

var prometheus = networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}

// The operator's pods accept connections on the webhook port from the address blocks the
// values name (everywhere by default: the API server's are unknowable), on the metrics port
// from pods of every namespace but the job namespace and from the peers the values name,
// and on no other port: not the probe port, which the kubelet reaches from the pod's own
// node whatever the policy. Job pods accept no connections from other pods.
func TestNetworkPolicy(t *testing.T) {
	cases := []struct {
		name string
		args []string
		// operator is the ingress of the operator's policy, nil when there is none;
		// jobs says whether the job namespace's policy is made.
		operator []rule
		jobs     bool
	}{
		{
			name: "default",
			operator: []rule{
				{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{cidr("0.0.0.0/0"), cidr("::/0")}},
				warmPods,
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{allButJobs}},
			},
			jobs: true,
		},
		{
			name: "pod CIDRs taken out of the webhook's blocks, each from its own family",
			args: []string{"--set-json", `networkPolicy.webhookExceptCIDRs=["10.244.0.0/16","fd00:10:244::/56","10.96.0.0/12"]`,
				"--set-json", `networkPolicy.webhookFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"konnectivity"}}}]`},
			operator: []rule{
				{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{
					cidr("0.0.0.0/0", "10.244.0.0/16", "10.96.0.0/12"), cidr("::/0", "fd00:10:244::/56"),
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "konnectivity"}}},
				}},
				warmPods,
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{allButJobs}},
			},
			jobs: true,
		},
		{
			name: "the control plane's addresses, and Prometheus alone for metrics",
			args: []string{"--set-json", `networkPolicy.webhookFromCIDRs=["172.16.0.0/28"]`,
				"--set", "networkPolicy.metricsFromOtherNamespaces=false",
				"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
			operator: []rule{
				{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{cidr("172.16.0.0/28")}},
				warmPods,
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{prometheus}},
			},
			jobs: true,
		},
		{
			name: "other namespaces and Prometheus for metrics",
			args: []string{"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
			operator: []rule{
				{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{cidr("0.0.0.0/0"), cidr("::/0")}},
				warmPods,
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{allButJobs, prometheus}},
			},
			jobs: true,
		},
		{
			name: "no warm pools: no warm pods admitted",
			args: []string{"--set", "warmPools.enabled=false"},
			operator: []rule{
				{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{cidr("0.0.0.0/0"), cidr("::/0")}},
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{allButJobs}},
			},
			jobs: true,
		},
		{
			name: "no webhooks: no webhook port open",
			args: []string{"--set", "webhooks.enabled=false"},
			operator: []rule{
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{allButJobs}},
			},
			jobs: true,
		},
		{
			name:     "no webhooks and no scrapers: nothing let in",
			args:     []string{"--set", "webhooks.enabled=false", "--set", "networkPolicy.metricsFromOtherNamespaces=false"},
			operator: []rule{},
			jobs:     true,
		},
		{
			name: "no metrics: no metrics port open",
			args: []string{"--set", "metrics.enabled=false", "--set", "webhooks.port=9444"},
			operator: []rule{
				{ports: []int32{9444}, from: []networkingv1.NetworkPolicyPeer{cidr("0.0.0.0/0"), cidr("::/0")}},
				{ports: []int32{9444}, from: warmPods.from},
			},
			jobs: true,
		},
		{
			name: "job pods' ingress left alone",
			args: []string{"--set", "networkPolicy.denyJobPodIngress=false"},
			operator: []rule{
				{ports: []int32{9443}, from: []networkingv1.NetworkPolicyPeer{cidr("0.0.0.0/0"), cidr("::/0")}},
				warmPods,
				{ports: []int32{8443}, from: []networkingv1.NetworkPolicyPeer{allButJobs}},
			},
		},
		{name: "off", args: []string{"--set", "networkPolicy.enabled=false"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, tc.args...)
			policies := map[string]networkingv1.NetworkPolicy{}
			for _, np := range byKind[networkingv1.NetworkPolicy](t, out, "NetworkPolicy") {
				policies[np.Namespace] = np
			}

			operator, ok := policies["buildkite"]
			require.Equal(t, tc.operator != nil, ok, "the operator's NetworkPolicy is made")
			if ok {
				assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, operator.Spec.PolicyTypes)
				assert.NotNil(t, operator.Spec.Ingress, "an empty list, which lets nothing in, rather than none")
				assert.Equal(t, tc.operator, rules(operator))

				// It selects the operator's pods, and its rules never open the probe port.
				d := byKind[appsv1.Deployment](t, out, "Deployment")
				require.Len(t, d, 1)
				sel, err := metav1.LabelSelectorAsSelector(&operator.Spec.PodSelector)
				require.NoError(t, err)
				assert.True(t, sel.Matches(labels.Set(d[0].Spec.Template.Labels)), "the policy does not select the operator's pods")
				for _, r := range operator.Spec.Ingress {
					for _, p := range r.Ports {
						assert.NotEqual(t, int32(8081), p.Port.IntVal, "the probe port is open to others than the kubelet")
					}
				}
			}

			jobs, ok := policies["buildkite-jobs"]
			require.Equal(t, tc.jobs, ok, "the job namespace's NetworkPolicy is made")
			if ok {
				assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, jobs.Spec.PolicyTypes)
				assert.Empty(t, jobs.Spec.Ingress, "job pods let something in")
				assert.Empty(t, jobs.Spec.Egress)
				sel, err := metav1.LabelSelectorAsSelector(&jobs.Spec.PodSelector)
				require.NoError(t, err)
				assert.True(t, sel.Matches(labels.Set{"app.kubernetes.io/managed-by": "buildkite-operator", "buildkite-operator.dev/buildjob": "x"}), "job pods are not selected")
				assert.False(t, sel.Matches(labels.Set{"app": "something-else"}), "other pods of the job namespace are selected")
			}
		})
	}
}

// The webhooks always fail closed: the chart offers no failure policy of Ignore, and says
// so to an old values file that asks for it. Without webhooks the operator is told so.
func TestWebhooksFailClosed(t *testing.T) {
	out := render(t)
	var policies int
	for _, c := range byKind[admissionregistrationv1.ValidatingWebhookConfiguration](t, out, "ValidatingWebhookConfiguration") {
		for _, w := range c.Webhooks {
			require.NotNil(t, w.FailurePolicy, w.Name)
			assert.Equal(t, admissionregistrationv1.Fail, *w.FailurePolicy, w.Name)
			policies++
		}
	}
	for _, c := range byKind[admissionregistrationv1.MutatingWebhookConfiguration](t, out, "MutatingWebhookConfiguration") {
		for _, w := range c.Webhooks {
			require.NotNil(t, w.FailurePolicy, w.Name)
			assert.Equal(t, admissionregistrationv1.Fail, *w.FailurePolicy, w.Name)
			policies++
		}
	}
	assert.Equal(t, 3, policies, "the BuildJob validating and mutating webhooks and the BuildEnvironment one")

	for _, value := range []string{"buildJobFailurePolicy", "buildEnvironmentFailurePolicy"} {
		msg, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set", "webhooks."+value+"=Ignore").CombinedOutput()
		require.Error(t, err, "webhooks.%s=Ignore was rendered", value)
		assert.Contains(t, string(msg), "webhooks."+value+"=Ignore is no longer offered")
		assert.Contains(t, string(msg), "webhooks.enabled=false")
	}
	// Fail, which an old values file may say, changes nothing.
	assert.Equal(t, string(out), string(render(t, "--set", "webhooks.buildJobFailurePolicy=Fail")))

	off := render(t, "--set", "webhooks.enabled=false")
	assert.Empty(t, byKind[admissionregistrationv1.ValidatingWebhookConfiguration](t, off, "ValidatingWebhookConfiguration"))
	assert.Empty(t, byKind[admissionregistrationv1.MutatingWebhookConfiguration](t, off, "MutatingWebhookConfiguration"))
	d := byKind[appsv1.Deployment](t, off, "Deployment")
	require.Len(t, d, 1)
	assert.Contains(t, d[0].Spec.Template.Spec.Containers[0].Args, "--webhooks=false")
}

// The agent endpoints allowed beside the configured one reach the operator's flag, and
// anything but an http(s) URL is refused.
func TestAllowedAgentEndpoints(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"none by default", nil, "--allowed-agent-endpoints="},
		{"listed", []string{"--set-json", `buildkite.allowedAgentEndpoints=["https://agent-edge.buildkite.com/v3","https://agent.eu.buildkite.com/v3"]`},
			"--allowed-agent-endpoints=https://agent-edge.buildkite.com/v3,https://agent.eu.buildkite.com/v3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := byKind[appsv1.Deployment](t, render(t, tc.args...), "Deployment")
			require.Len(t, d, 1)
			assert.Contains(t, d[0].Spec.Template.Spec.Containers[0].Args, tc.want)
		})
	}
	out, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set-json", `buildkite.allowedAgentEndpoints=["agent-edge.buildkite.com"]`).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "/buildkite/allowedAgentEndpoints/0")
}
