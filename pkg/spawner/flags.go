package spawner

import (
	"flag"
	"fmt"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
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
	// What the agent shares with the operator goes by the agent's flag and variable names.
	flagenv.String(fs, &c.Priority, "priority", "BUILDKITE_AGENT_PRIORITY", "",
		"the agent priority of every slot, a whole number: Buildkite offers jobs to higher priorities first")
	flagenv.String(fs, &c.PingMode, "ping-mode", "BK_OPERATOR_PING_MODE", PingModeAuto,
		"how slots learn of their jobs, as the agent's --ping-mode: auto (Buildkite's streaming ping, which pushes a job at once, where it offers it; polling while it is down or where it does not), ping-only (poll every ping interval) or stream-only (never poll)")
	c.bindPolicyFlags(fs)
}

// bindPolicyFlags adds the flags of the job policy (Config.Policy): the agent's, with the
// agent's variables, bar --verification-jwks-key-id, which the agent does not have.
func (c *Config) bindPolicyFlags(fs *flag.FlagSet) {
	p := &c.Policy
	flagenv.String(fs, &p.VerificationJWKSFile, "verification-jwks-file", "BUILDKITE_AGENT_VERIFICATION_JWKS_FILE", "",
		"file holding a JSON Web Key Set whose public keys verify job signatures (signed pipelines); without it, a signed job cannot be verified")
	flagenv.String(fs, &p.VerificationJWKSKeyID, "verification-jwks-key-id", "BUILDKITE_AGENT_VERIFICATION_JWKS_KEY_ID", "",
		"verify job signatures with only the key of this id in the --verification-jwks-file key set (every key of the set when empty)")
	flagenv.String(fs, &p.VerificationFailureBehavior, "verification-failure-behavior", "BUILDKITE_AGENT_JOB_VERIFICATION_NO_SIGNATURE_BEHAVIOR", jobpolicy.Block,
		"what happens to a job whose signature is missing or cannot be verified: block (it is refused, signal reason signature_rejected) or warn (it runs, with a warning in its log)")
	// Lists, as the agent's: comma-separated, and a flag given twice adds to the list.
	list := func(name, env, usage string, into *[]string) {
		flagenv.Func(fs, name, env, usage, func(v string) error {
			*into = append(*into, splitTags(v)...)
			return nil
		})
	}
	list("allowed-repositories", "BUILDKITE_ALLOWED_REPOSITORIES",
		"comma-separated regular expressions of the repositories jobs may check out (such as ^git@github.com:acme/); a job of another repository is refused (agent_refused); every repository when empty",
		&p.AllowedRepositories)
	list("allowed-plugins", "BUILDKITE_ALLOWED_PLUGINS",
		"comma-separated regular expressions of the plugins jobs may use, matched against their full source (such as ^github.com/buildkite-plugins/docker-buildkite-plugin#); a job using another is refused (agent_refused); every plugin when empty",
		&p.AllowedPlugins)
	flagenv.Bool(fs, &p.EnableEnvironmentVariableAllowlist, "enable-environment-variable-allowlist", "BUILDKITE_ENABLE_ENVIRONMENT_VARIABLE_ALLOWLIST", false,
		"run only jobs whose env variables all match --allowed-environment-variables or are set by Buildkite (BUILDKITE, BUILDKITE_*, CI); others are refused (agent_refused)")
	list("allowed-environment-variables", "BUILDKITE_ALLOWED_ENVIRONMENT_VARIABLES",
		"comma-separated regular expressions of the env variable names jobs may have (such as ^MYAPP_); needs --enable-environment-variable-allowlist",
		&p.AllowedEnvironmentVariables)
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
	// The key set is read when the spawner is made (New); the rest is checked here, where
	// a mistake in a flag is told as one.
	if err := c.Policy.Validate(); err != nil {
		return err
	}
	mode, err := canonicalPingMode(c.PingMode)
	if err != nil {
		return fmt.Errorf("-ping-mode: %w", err)
	}
	c.PingMode = mode
	return validPriority(c.Priority)
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
