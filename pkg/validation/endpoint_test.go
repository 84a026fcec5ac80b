package validation_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

func TestEndpointAllowed(t *testing.T) {
	const configured = "https://agent.buildkite.com/v3"
	for _, tc := range []struct {
		endpoint, configured string
		want                 bool
	}{
		{"", configured, true},
		{configured, configured, true},
		{configured + "/", configured, true},
		// Buildkite may move an agent to another host of its own.
		{"https://agent-edge.buildkite.com/v3", configured, true},
		{"https://evil.example.com/v3", configured, false},
		{"http://agent.buildkite.com/v3", configured, false},
		{"https://agent.buildkite.com.evil.example/v3", configured, false},
		{"https://buildkite.com.evil.example/v3", configured, false},
		{"https://user@agent-edge.buildkite.com/v3", configured, false},
		{"not a url", configured, false},
		// A configured endpoint without a parent domain (a test fake, an IP) has no siblings.
		{"http://127.0.0.1:8080/v3", "http://127.0.0.1:8080/v3", true},
		{"http://127.0.0.1:9090/v3", "http://127.0.0.1:8080/v3", false},
		{"https://10.0.0.2/v3", "https://10.0.0.1/v3", false},
		{"https://other.local/v3", "https://fake.local/v3", false},
	} {
		assert.Equal(t, tc.want, validation.EndpointAllowed(tc.endpoint, tc.configured), "%q with %q configured", tc.endpoint, tc.configured)
	}
}
