package validation

import (
	"net"
	"net/url"
	"strings"
)

// EndpointAllowed reports whether a BuildJob may name endpoint as its Buildkite agent API,
// given the operator's configured one: the controller and the job's pod send the job token
// there. Allowed are no endpoint (the configured one is used), the configured endpoint,
// and an https endpoint on another host under the configured host's parent domain, which
// is how Buildkite moves agents between its own hosts (a register or ping response naming
// agent-edge.buildkite.com for agent.buildkite.com, say).
func EndpointAllowed(endpoint, configured string) bool {
	if endpoint == "" || strings.TrimRight(endpoint, "/") == strings.TrimRight(configured, "/") {
		return true
	}
	e, err := url.Parse(endpoint)
	if err != nil || e.Scheme != "https" || e.User != nil || e.Host == "" {
		return false
	}
	c, err := url.Parse(configured)
	if err != nil || c.Scheme != "https" {
		return false
	}
	parent := parentDomain(c.Hostname())
	return parent != "" && strings.HasSuffix(strings.ToLower(e.Hostname()), "."+parent)
}

// parentDomain is host without its first label, when what is left is still a domain of
// at least two labels (agent.buildkite.com: buildkite.com); "" for an IP address or a
// host with fewer labels.
func parentDomain(host string) string {
	host = strings.ToLower(host)
	if net.ParseIP(host) != nil {
		return ""
	}
	_, parent, ok := strings.Cut(host, ".")
	if !ok || !strings.Contains(parent, ".") {
		return ""
	}
	return parent
}
