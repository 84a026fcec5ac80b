package validation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

func TestEndpointAllowed(t *testing.T) {
	const configured = "https://agent.buildkite.com/v3"
	for _, tc := range []struct {
		name, endpoint, configured string
		allowed                    []string
		want                       bool
	}{
		{name: "none: the configured one is used", endpoint: "", configured: configured, want: true},
		{name: "the configured one", endpoint: configured, configured: configured, want: true},
		{name: "the configured one with a trailing slash", endpoint: configured + "/", configured: configured, want: true},
		{name: "the configured one, host in upper case", endpoint: "HTTPS://Agent.Buildkite.com/v3", configured: configured, want: true},
		{name: "the configured one with a port", endpoint: "http://127.0.0.1:8080/v3", configured: "http://127.0.0.1:8080/v3", want: true},

		// No host is trusted for its parent domain: a sibling is someone else's.
		{name: "a sibling host under the configured host's domain", endpoint: "https://agent-edge.buildkite.com/v3", configured: configured, want: false},
		{name: "another app on a shared platform domain", endpoint: "https://evil.herokuapp.com/v3", configured: "https://my-buildkite-proxy.herokuapp.com/v3", want: false},
		{name: "another site under a public suffix", endpoint: "https://evil.co.uk/v3", configured: "https://buildkite.co.uk/v3", want: false},
		{name: "the parent domain itself", endpoint: "https://buildkite.com/v3", configured: configured, want: false},
		{name: "another path on the configured host", endpoint: "https://agent.buildkite.com/v2", configured: configured, want: false},
		{name: "another port of the configured host", endpoint: "http://127.0.0.1:9090/v3", configured: "http://127.0.0.1:8080/v3", want: false},

		// Listed endpoints (--allowed-agent-endpoints) are allowed, exactly.
		{name: "a listed endpoint", endpoint: "https://agent-edge.buildkite.com/v3", configured: configured,
			allowed: []string{"https://agent-edge.buildkite.com/v3"}, want: true},
		{name: "a listed endpoint with a trailing slash", endpoint: "https://agent-edge.buildkite.com/v3/", configured: configured,
			allowed: []string{"https://other.buildkite.com/v3", "https://agent-edge.buildkite.com/v3"}, want: true},
		{name: "a sibling of a listed endpoint", endpoint: "https://evil.buildkite.com/v3", configured: configured,
			allowed: []string{"https://agent-edge.buildkite.com/v3"}, want: false},
		{name: "a listed endpoint over http when https is listed", endpoint: "http://agent-edge.buildkite.com/v3", configured: configured,
			allowed: []string{"https://agent-edge.buildkite.com/v3"}, want: false},

		{name: "unknown host", endpoint: "https://evil.example.com/v3", configured: configured, want: false},
		{name: "http for the configured https", endpoint: "http://agent.buildkite.com/v3", configured: configured, want: false},
		{name: "the configured host as a prefix", endpoint: "https://agent.buildkite.com.evil.example/v3", configured: configured, want: false},
		{name: "user info", endpoint: "https://user@agent.buildkite.com/v3", configured: configured, want: false},
		{name: "a query", endpoint: "https://agent.buildkite.com/v3?x=1", configured: configured, want: false},
		{name: "not a URL", endpoint: "not a url", configured: configured, want: false},
		{name: "not a URL configured", endpoint: "not a url", configured: "not a url", want: false},
		{name: "another IP address", endpoint: "https://10.0.0.2/v3", configured: "https://10.0.0.1/v3", want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, validation.EndpointAllowed(tc.endpoint, tc.configured, tc.allowed...),
				"%q with %q configured and %q listed", tc.endpoint, tc.configured, tc.allowed)
		})
	}
}

func TestValidEndpoint(t *testing.T) {
	for _, tc := range []struct {
		endpoint string
		want     bool
	}{
		{"https://agent.buildkite.com/v3", true},
		{"http://127.0.0.1:8080/v3", true},
		{"agent.buildkite.com/v3", false},
		{"ftp://agent.buildkite.com/v3", false},
		{"https://user:pass@agent.buildkite.com/v3", false},
		{"", false},
	} {
		assert.Equal(t, tc.want, validation.ValidEndpoint(tc.endpoint), tc.endpoint)
	}
}
