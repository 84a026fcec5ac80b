package main

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

// The webhook server listens on --webhook-port (or its variable), 9443 by default: the
// chart's webhooks.port sets it with the Service's targetPort, so the two cannot part.
func TestWebhookPort(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    int
		wantErr string
	}{
		{name: "default", want: 9443},
		{name: "the flag", args: []string{"--webhook-port=10443"}, want: 10443},
		{name: "the variable", env: map[string]string{"BK_OPERATOR_WEBHOOK_PORT": "10444"}, want: 10444},
		{name: "the flag wins", args: []string{"--webhook-port", "10445"}, env: map[string]string{"BK_OPERATOR_WEBHOOK_PORT": "10444"}, want: 10445},
		{name: "0 is no port", args: []string{"--webhook-port=0"}, wantErr: "-webhook-port 0: give a port from 1 to 65535"},
		{name: "beyond the last port", args: []string{"--webhook-port=65536"}, wantErr: "-webhook-port 65536"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c operatorConfig
			require.NoError(t, flagenv.ParseEnv(c.flags(), tc.args, func(k string) string { return tc.env[k] }))
			srv, err := c.manager.webhookServer()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.IsType(t, &crwebhook.DefaultServer{}, srv)
			assert.Equal(t, tc.want, srv.(*crwebhook.DefaultServer).Options.Port)
		})
	}

	// `agentd spawner` serves no webhooks: no such flag, and controller-runtime's server
	// is left alone.
	var s spawnerConfig
	assert.Nil(t, s.flags().Lookup("webhook-port"))
	srv, err := s.manager.webhookServer()
	require.NoError(t, err)
	assert.Nil(t, srv)
}

// The port reaches the server of the manager the operator runs, which its webhooks are
// registered on (webhook.Setup takes mgr.GetWebhookServer()).
func TestWebhookPortReachesTheManager(t *testing.T) {
	env, err := testenv.Start()
	require.NoError(t, err)
	defer func() { _ = env.Stop() }()
	for _, port := range []int{9443, 10443} {
		t.Run(strconv.Itoa(port), func(t *testing.T) {
			var c operatorConfig
			args := []string{"--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0"}
			if port != 9443 {
				args = append(args, "--webhook-port="+strconv.Itoa(port))
			}
			require.NoError(t, flagenv.ParseEnv(c.flags(), args, noEnv))
			mgr, err := c.manager.newManager(env.KubeconfigPath)
			require.NoError(t, err)
			srv, ok := mgr.GetWebhookServer().(*crwebhook.DefaultServer)
			require.True(t, ok, "%T", mgr.GetWebhookServer())
			assert.Equal(t, port, srv.Options.Port)
		})
	}
}
