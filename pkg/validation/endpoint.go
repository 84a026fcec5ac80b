package validation

import (
	"net/url"
	"strings"
)

// EndpointAllowed reports whether a BuildJob may name endpoint as its Buildkite agent API,
// given the operator's configured one and the further endpoints the operator was told to
// allow (--allowed-agent-endpoints): the controller and the job's pod send the job token
// there. Allowed are no endpoint (the configured one is used), the configured endpoint,
// and a listed one, each matched exactly (scheme and host in any case, a trailing slash
// ignored). No host is trusted for its domain: a sibling under a shared parent such as
// herokuapp.com or co.uk belongs to someone else, so Buildkite moving agents to another of
// its hosts must be allowed by listing that host.
func EndpointAllowed(endpoint, configured string, allowed ...string) bool {
	if endpoint == "" {
		return true
	}
	e, ok := canonicalEndpoint(endpoint)
	if !ok {
		return false
	}
	for _, a := range append([]string{configured}, allowed...) {
		if c, ok := canonicalEndpoint(a); ok && c == e {
			return true
		}
	}
	return false
}

// ValidEndpoint reports whether endpoint can be allowed at all: an absolute http or https
// URL with a host and no user info, query or fragment. Flags naming endpoints check it so
// that a typo is refused at start rather than matching nothing.
func ValidEndpoint(endpoint string) bool {
	_, ok := canonicalEndpoint(endpoint)
	return ok
}

// canonicalEndpoint is endpoint with its scheme and host lower-cased and trailing slashes
// dropped, so that equal endpoints compare equal as strings; false for anything that is
// not an absolute http(s) URL with a host, or that carries user info, a query or a
// fragment (which the operator never configures, and which would only serve to make one
// endpoint look like another).
func canonicalEndpoint(endpoint string) (string, bool) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return "", false
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "https" && scheme != "http" {
		return "", false
	}
	return scheme + "://" + strings.ToLower(u.Host) + strings.TrimRight(u.EscapedPath(), "/"), true
}
