package certs_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/webhook/certs"
)

// webhookConfigurations creates a Validating- and a MutatingWebhookConfiguration named
// name, each with one webhook that matches nothing the tests create and no caBundle.
func webhookConfigurations(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	rules := []admissionv1.RuleWithOperations{{
		Operations: []admissionv1.OperationType{admissionv1.Create},
		Rule:       admissionv1.Rule{APIGroups: []string{"example.invalid"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}},
	}}
	cc := admissionv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/" + name)}
	none := ptr.To(admissionv1.SideEffectClassNone)
	v := &admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: []admissionv1.ValidatingWebhook{{
		Name: "v.example.invalid", ClientConfig: cc, Rules: rules, SideEffects: none, AdmissionReviewVersions: []string{"v1"},
	}}}
	m := &admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name}, Webhooks: []admissionv1.MutatingWebhook{{
		Name: "m.example.invalid", ClientConfig: cc, Rules: rules, SideEffects: none, AdmissionReviewVersions: []string{"v1"},
	}}}
	require.NoError(t, env.Client.Create(ctx, v))
	require.NoError(t, env.Client.Create(ctx, m))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), v)
		_ = env.Client.Delete(context.Background(), m)
	})
}

// caBundles are the caBundles of the configurations named name, validating then mutating.
func caBundles(t *testing.T, name string) (validating, mutating []byte) {
	t.Helper()
	ctx := context.Background()
	var v admissionv1.ValidatingWebhookConfiguration
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, &v))
	var m admissionv1.MutatingWebhookConfiguration
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, &m))
	return v.Webhooks[0].ClientConfig.CABundle, m.Webhooks[0].ClientConfig.CABundle
}

// Two operators share a cluster, each with its own webhook configurations (the chart names
// them <fullname>-<release namespace>): each operator writes its CA into its own two, and
// leaves the other's alone, whose webhooks its certificate does not serve.
func TestEachOperatorKeepsItsOwnConfigurations(t *testing.T) {
	ctx := context.Background()
	webhookConfigurations(t, "ci-a-operator-ci-a")
	webhookConfigurations(t, "ci-b-operator-ci-b")
	m, err := certs.New(env.Client, env.Client, certs.Config{
		Namespace: ns, SecretName: "names-certs", Hosts: []string{"ci-a-operator-webhook.ci-a.svc"},
		WebhookConfigNames: []string{"ci-a-operator-ci-a"},
		CertValidity:       time.Hour, RotateBefore: 10 * time.Minute,
	}, logr.Discard())
	require.NoError(t, err)
	_, err = m.Ensure(ctx)
	require.NoError(t, err)

	var secret corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "names-certs"}, &secret))
	ca := secret.Data[certs.KeyCACert]
	require.NotEmpty(t, ca)
	v, mw := caBundles(t, "ci-a-operator-ci-a")
	assert.Equal(t, ca, v, "its ValidatingWebhookConfiguration carries its CA")
	assert.Equal(t, ca, mw, "its MutatingWebhookConfiguration carries its CA")
	v, mw = caBundles(t, "ci-b-operator-ci-b")
	assert.Empty(t, v, "the other operator's ValidatingWebhookConfiguration is left alone")
	assert.Empty(t, mw, "the other operator's MutatingWebhookConfiguration is left alone")

	// Told a name no configuration has (another release's, or the fixed default of an
	// operator run without the chart), it says so, and what to set.
	lost, err := certs.New(env.Client, env.Client, certs.Config{
		Namespace: ns, SecretName: "names-certs-lost", Hosts: []string{"x.svc"},
		WebhookConfigNames: []string{"buildkite-operator"},
		CertValidity:       time.Hour, RotateBefore: 10 * time.Minute,
	}, logr.Discard())
	require.NoError(t, err)
	_, err = lost.Ensure(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no Validating or MutatingWebhookConfiguration named "buildkite-operator"`)
	assert.Contains(t, err.Error(), "--webhook-configuration-name")
}
