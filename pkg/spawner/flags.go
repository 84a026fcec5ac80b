package spawner

import (
	"flag"
	"fmt"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/validation"
)

// BindFlags adds the spawner's flags to fs, writing into c. Every flag has an environment
// variable twin, named in its help, so a Deployment may use either. Parse fs with
// flagenv.Parse (which reads the twins), then call c.FinishFlags.
//
// The namespace is not among them: the command that runs the spawner shares it with its
// other components.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	flagenv.String(fs, &c.Name, "spawner-name", "BK_OPERATOR_NAME", DefaultName,
		"operator name: slot agents register as <name>-<n>")
	flagenv.String(fs, &c.Endpoint, "agent-endpoint", "BUILDKITE_AGENT_ENDPOINT", agentapi.DefaultEndpoint,
		"Buildkite agent API endpoint")
	flagenv.Func(fs, "allowed-agent-endpoints", "BK_OPERATOR_ALLOWED_AGENT_ENDPOINTS", "further Buildkite agent API endpoints job tokens may be sent to (where Buildkite may move agents), comma-separated, each matched exactly", func(v string) error {
		c.AllowedEndpoints = splitTags(v) // any comma-separated list, tags or not
		for _, e := range c.AllowedEndpoints {
			if !validation.ValidEndpoint(e) {
				return fmt.Errorf("%q is not an http(s) URL with a host and no user, query or fragment, such as https://agent.buildkite.com/v3", e)
			}
		}
		return nil
	})
	flagenv.Int(fs, &c.Slots, "slots", "BK_OPERATOR_SLOTS", DefaultSlots,
		"most jobs in flight: one agent registration per slot")
	flagenv.String(fs, &c.Queue, "queue", "BK_OPERATOR_QUEUE", DefaultQueue,
		"the queue tag of every slot")
	flagenv.Func(fs, "tags", "BK_OPERATOR_TAGS", "extra agent tags, comma-separated key=value, such as cluster=gke-prod", func(v string) error {
		c.Tags = splitTags(v)
		return nil
	})
	flagenv.String(fs, &c.RegistrationTokenFile, "registration-token-file", "BUILDKITE_AGENT_TOKEN_PATH", "",
		"file holding the agent registration token")
	flagenv.Func(fs, "registration-token-secret", "BK_OPERATOR_REGISTRATION_TOKEN_SECRET", "Secret holding the agent registration token, as name or name/key (key default \"token\")", func(v string) error {
		c.RegistrationTokenSecret = parseSecretKey(v)
		return nil
	})
	flagenv.String(fs, &c.DefaultBuildEnvironment, "default-build-environment", "BK_OPERATOR_DEFAULT_BUILD_ENVIRONMENT", "",
		"BuildEnvironment of jobs that name none")
	flagenv.Duration(fs, &c.CreateTimeout, "create-timeout", "BK_OPERATOR_CREATE_TIMEOUT", DefaultCreateTimeout,
		"how long to retry creating a job's BuildJob before failing the job")
	flagenv.Duration(fs, &c.ReregisterAfter, "reregister-after", "BK_OPERATOR_REREGISTER_AFTER", DefaultReregisterAfter,
		"how long a slot Buildkite disconnected waits before registering anew")
}

// FinishFlags checks what the flags cannot: a token source from the environment and
// one from a flag are not both kept.
func (c *Config) FinishFlags(fs *flag.FlagSet) error {
	fileSet, secretSet := false, false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "registration-token-file":
			fileSet = true
		case "registration-token-secret":
			secretSet = true
		}
	})
	switch {
	case fileSet && !secretSet:
		c.RegistrationTokenSecret = nil
	case secretSet && !fileSet:
		c.RegistrationTokenFile = ""
	}
	if c.Slots < 1 {
		return fmt.Errorf("-slots %d: allow at least 1 job in flight", c.Slots)
	}
	return nil
}

func splitTags(v string) []string {
	var out []string
	for _, t := range strings.Split(v, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

func parseSecretKey(v string) *SecretKey {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil
	}
	name, key, _ := strings.Cut(v, "/")
	return &SecretKey{Name: name, Key: key}
}
