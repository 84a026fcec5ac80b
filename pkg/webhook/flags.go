package webhook

import (
	"flag"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

// Defaults of Options, as the flags (BindFlags) and the Helm chart have them.
const (
	DefaultServiceName = "buildkite-operator-webhook"
	DefaultSecretName  = "buildkite-operator-webhook-tls"
	// DefaultWebhookConfigName names both the Validating- and the
	// MutatingWebhookConfiguration the Helm chart installs.
	DefaultWebhookConfigName = "buildkite-operator"
	DefaultManageCerts       = true
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
	flagenv.Bool(fs, &o.ManageCerts, "manage-webhook-certs", "BK_OPERATOR_MANAGE_WEBHOOK_CERTS", DefaultManageCerts,
		"mint and rotate the webhook's certificates; false when cert-manager provides them")
}
