package spawner

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// BindFlags adds the spawner's flags to fs, writing into c. Each flag's default comes
// from the environment variable named in its help, so a Deployment may use either.
// Call c.FinishFlags after fs is parsed.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "spawner-name", envOr("BK_OPERATOR_NAME", "bk-operator"),
		"operator name: slot agents register as <name>-<n> (env BK_OPERATOR_NAME)")
	fs.StringVar(&c.Endpoint, "agent-endpoint", envOr("BUILDKITE_AGENT_ENDPOINT", "https://agent.buildkite.com/v3"),
		"Buildkite agent API endpoint (env BUILDKITE_AGENT_ENDPOINT)")
	fs.IntVar(&c.Slots, "slots", envInt("BK_OPERATOR_SLOTS", 10),
		"most jobs in flight: one agent registration per slot (env BK_OPERATOR_SLOTS)")
	fs.StringVar(&c.Queue, "queue", envOr("BK_OPERATOR_QUEUE", DefaultQueue),
		"the queue tag of every slot (env BK_OPERATOR_QUEUE)")
	fs.Func("tags", "extra agent tags, comma-separated key=value, such as cluster=gke-prod (env BK_OPERATOR_TAGS)", func(v string) error {
		c.Tags = splitTags(v)
		return nil
	})
	c.Tags = splitTags(os.Getenv("BK_OPERATOR_TAGS"))
	fs.StringVar(&c.RegistrationTokenFile, "registration-token-file", os.Getenv("BUILDKITE_AGENT_TOKEN_PATH"),
		"file holding the agent registration token (env BUILDKITE_AGENT_TOKEN_PATH)")
	fs.Func("registration-token-secret", "Secret holding the agent registration token, as name or name/key (key default \"token\") (env BK_OPERATOR_REGISTRATION_TOKEN_SECRET)", func(v string) error {
		c.RegistrationTokenSecret = parseSecretKey(v)
		return nil
	})
	c.RegistrationTokenSecret = parseSecretKey(os.Getenv("BK_OPERATOR_REGISTRATION_TOKEN_SECRET"))
	fs.StringVar(&c.DefaultBuildEnvironment, "default-build-environment", os.Getenv("BK_OPERATOR_DEFAULT_BUILD_ENVIRONMENT"),
		"BuildEnvironment of jobs that name none (env BK_OPERATOR_DEFAULT_BUILD_ENVIRONMENT)")
	fs.DurationVar(&c.CreateTimeout, "create-timeout", envDuration("BK_OPERATOR_CREATE_TIMEOUT", DefaultCreateTimeout),
		"how long to retry creating a job's BuildJob before failing the job (env BK_OPERATOR_CREATE_TIMEOUT)")
	fs.DurationVar(&c.ReregisterAfter, "reregister-after", envDuration("BK_OPERATOR_REREGISTER_AFTER", DefaultReregisterAfter),
		"how long a slot Buildkite disconnected waits before registering anew (env BK_OPERATOR_REREGISTER_AFTER)")
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

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}
