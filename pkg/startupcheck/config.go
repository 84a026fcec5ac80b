// Package startupcheck is the operator's start-up check of Buildkite: once, as the operator
// starts, it runs pkg/preflight's checks (does the cluster and queue agentd registers with
// exist, is dispatch paused there) and reports what it found where a cluster operator
// looks: events on the operator's Pod, which `kubectl describe pod` shows, and the log.
//
// It runs on every replica, not only the leader: each replica's Pod then tells its own
// `kubectl describe` what is wrong, whichever one is looked at; it does not wait for an
// election, which may take a lease duration or, for a standby, forever; and its few
// read-only calls per start cost Buildkite's rate limit nothing that matters. It never
// holds up the spawner: the manager starts it beside everything else, and it ends once it
// has reported.
package startupcheck

import (
	"flag"
	"fmt"
	"regexp"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/preflight"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// Config is what the operator is told for its start-up check: an API access token, and
// which organization and cluster to look in.
type Config struct {
	TokenFile    string
	Organization string
	Cluster      string
	Endpoint     string
}

// BindFlags binds the check's flags, each with its environment variable, to c.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	flagenv.String(fs, &c.TokenFile, "buildkite-api-token-file", "BK_OPERATOR_BUILDKITE_API_TOKEN_FILE", "",
		"file holding a Buildkite API access token (not the agent token) with the read_clusters scope, and read_organizations when --buildkite-organization is empty: "+
			"with it, agentd checks once at start-up that its cluster and queue exist and that dispatch is not paused there, and says what to fix in events on its Pod; without it nothing is checked. "+
			"With the read_builds scope too, the warm pools of BuildEnvironments with a spec.warmPool.maxSize follow the jobs waiting on the queue (docs/preflight.md)")
	flagenv.String(fs, &c.Organization, "buildkite-organization", "BK_OPERATOR_BUILDKITE_ORGANIZATION", "",
		"slug of the Buildkite organization agentd registers in, for the start-up check; the one organization the API token reaches when empty")
	flagenv.String(fs, &c.Cluster, "buildkite-cluster", "BK_OPERATOR_BUILDKITE_CLUSTER", "",
		"name or UUID of the Buildkite cluster whose agent token agentd registers with, for the start-up check; every cluster is searched for the queue when empty")
	flagenv.String(fs, &c.Endpoint, "buildkite-api-endpoint", "BK_OPERATOR_BUILDKITE_API_ENDPOINT", preflight.DefaultEndpoint,
		"Buildkite REST API endpoint the start-up check asks (it is sent the API token)")
}

// orgSlug is what an organization slug may be: it goes into the REST API's paths as is.
var orgSlug = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// Validate refuses what cannot be right whatever Buildkite answers, naming the flag to fix.
func (c *Config) Validate() error {
	if !validation.ValidEndpoint(c.Endpoint) {
		return fmt.Errorf("--buildkite-api-endpoint %q: give an http(s) URL with a host and no user, query or fragment, such as %s", c.Endpoint, preflight.DefaultEndpoint)
	}
	if c.Organization != "" && !orgSlug.MatchString(c.Organization) {
		return fmt.Errorf("--buildkite-organization %q: give the organization's slug, as in https://buildkite.com/organizations/<slug>", c.Organization)
	}
	return nil
}
