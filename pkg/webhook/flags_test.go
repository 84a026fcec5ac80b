package webhook_test

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
)

// The webhook configurations' name comes from --webhook-configuration-name or its
// environment twin (the flag wins), and is the operator's fixed default without either:
// two operators in a cluster are each given their own.
func TestWebhookConfigurationNameFlag(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "default", want: webhook.DefaultWebhookConfigurationName},
		{name: "flag", args: []string{"--webhook-configuration-name=ci-operator-ci"}, want: "ci-operator-ci"},
		{name: "environment", env: map[string]string{"BK_OPERATOR_WEBHOOK_CONFIGURATION_NAME": "from-env"}, want: "from-env"},
		{name: "flag over environment", args: []string{"--webhook-configuration-name=from-flag"},
			env: map[string]string{"BK_OPERATOR_WEBHOOK_CONFIGURATION_NAME": "from-env"}, want: "from-flag"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var o webhook.Options
			fs := flag.NewFlagSet("operator", flag.ContinueOnError)
			o.BindFlags(fs)
			require.NoError(t, flagenv.ParseEnv(fs, tc.args, func(k string) string { return tc.env[k] }))
			assert.Equal(t, tc.want, o.WebhookConfigurationName)
		})
	}
	assert.Equal(t, "buildkite-operator", webhook.DefaultWebhookConfigurationName)
}

// An operator that manages its certificates must know which configurations to write the CA
// into: without a name it would keep none current, and every webhook call would fail on
// the API server's side with an unknown CA. Setup refuses that with what to set.
func TestSetupNeedsTheConfigurationName(t *testing.T) {
	for _, tc := range []struct {
		name, configName, wantErr string
	}{
		{name: "empty", configName: "", wantErr: "--webhook-configuration-name"},
		{name: "named", configName: "buildkite-operator-buildkite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
				Scheme:                 env.Scheme,
				Metrics:                metricsserver.Options{BindAddress: "0"},
				HealthProbeBindAddress: "0",
				WebhookServer:          crwebhook.NewServer(crwebhook.Options{Port: 0, CertDir: t.TempDir()}),
			})
			require.NoError(t, err)
			err = webhook.Setup(mgr, webhook.Options{
				Namespace: "buildkite", ServiceName: webhook.DefaultServiceName, SecretName: webhook.DefaultSecretName,
				WebhookConfigurationName: tc.configName, ManageCerts: true,
			})
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
