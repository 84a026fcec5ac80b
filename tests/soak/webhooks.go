package soak

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// webhookPort is where the host operator's webhook server listens: controller-runtime's
// default, which the chart's Deployment names "webhook".
const webhookPort = 9443

// hostWebhooks installs the chart's webhook Service and configurations, the Service pointed
// at this host rather than at pods: the local node's API server (--enable-aggregator-routing)
// calls a webhook at its Service's endpoints (an EndpointSlice), here hostIP, where the operator on the host
// listens. The operator then mints the certificate for the Service's names and puts its CA
// into the configurations, as it does in the cluster, and BuildJobs and BuildEnvironments
// pass its webhooks, which fail closed. It returns the configurations' name, which the
// operator must be given (--webhook-configuration-name) to keep their caBundle.
func hostWebhooks(ctx context.Context, c client.Client, namespace, jobNamespace, hostIP string) (string, error) {
	out, err := helmchart.Render(namespace, "--show-only", "templates/webhooks.yaml", "--set", "jobNamespace.name="+jobNamespace)
	if err != nil {
		return "", err
	}
	objs, err := helmchart.Objects(out)
	if err != nil {
		return "", err
	}
	service, configuration := "", ""
	for _, obj := range objs {
		switch obj.GetKind() {
		case "Service":
			service = obj.GetName()
			// No selector: its endpoints are the ones made below, not pods'.
			unstructured.RemoveNestedField(obj.Object, "spec", "selector")
		case "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
			if configuration != "" && configuration != obj.GetName() {
				return "", fmt.Errorf("the chart names its webhook configurations differently (%s, %s): the operator keeps one name", configuration, obj.GetName())
			}
			configuration = obj.GetName()
		}
		if err := c.Create(ctx, obj); err != nil {
			return "", fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	if service == "" || configuration == "" {
		return "", fmt.Errorf("the chart rendered no webhook Service or configuration")
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: service + "-host", Namespace: namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{hostIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("webhook"), Port: ptr.To[int32](webhookPort), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.Create(ctx, slice); err != nil {
		return "", fmt.Errorf("creating the webhook Service's EndpointSlice: %w", err)
	}
	return configuration, nil
}
