package webhook

import (
	"flag"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// Defaults of Options, as the flags (BindFlags) have them. The Helm chart passes its own
// names, derived from the release, so that several operators share a cluster.
const (
	DefaultServiceName = "buildkite-operator-webhook"
	DefaultSecretName  = "buildkite-operator-webhook-tls"
	// DefaultWebhookConfigurationName names both the Validating- and the
	// MutatingWebhookConfiguration of an operator run without the chart, which names them
	// <fullname>-<release namespace> instead.
	DefaultWebhookConfigurationName = "buildkite-operator"
	DefaultManageCerts              = true
)

// BindFlags adds the webhooks' flags to fs, writing into o; each has an environment
// variable twin named in its help (parse fs with flagenv.Parse). The namespace and the
// default build environment are not among them: the operator shares them with its other
// components and copies them into o.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	flagenv.String(fs, &o.ServiceName, "webhook-service", "BK_OPERATOR_WEBHOOK_SERVICE", DefaultServiceName,
		"the Service the API server calls the webhooks through")
	flagenv.String(fs, &o.SecretName, "webhook-secret", "BK_OPERATOR_WEBHOOK_SECRET", DefaultSecretName,
		"the Secret holding the webhook's CA and serving certificate")
	flagenv.String(fs, &o.WebhookConfigurationName, "webhook-configuration-name", "BK_OPERATOR_WEBHOOK_CONFIGURATION_NAME", DefaultWebhookConfigurationName,
		"the name of the ValidatingWebhookConfiguration and the MutatingWebhookConfiguration whose caBundle the operator keeps current (with --manage-webhook-certs); each operator of a cluster needs its own (the chart's is <fullname>-<release namespace>)")
	flagenv.Bool(fs, &o.ManageCerts, "manage-webhook-certs", "BK_OPERATOR_MANAGE_WEBHOOK_CERTS", DefaultManageCerts,
		"mint and rotate the webhook's certificates; false when cert-manager provides them")
}
