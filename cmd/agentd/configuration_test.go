package main

import (
	"bytes"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
)

var update = flag.Bool("update", false, "rewrite the flag tables of docs/configuration.md from the flags")

const configurationDoc = "../../docs/configuration.md"

// commandFlags are the FlagSets of the commands that docs/configuration.md documents.
func commandFlags() []struct {
	name string
	fs   *flag.FlagSet
} {
	return []struct {
		name string
		fs   *flag.FlagSet
	}{
		{"agentd operator", new(operatorConfig).flags()},
		{"agentd spawner", new(spawnerConfig).flags()},
	}
}

// flagTable renders the flags of fs as the Markdown table docs/configuration.md holds.
func flagTable(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | environment variable | default | meaning |\n|---|---|---|---|\n")
	for _, f := range flagenv.List(fs) {
		def := "*none*"
		if f.Default != "" {
			def = "`" + f.Default + "`"
		}
		meaning := strings.NewReplacer("|", `\|`, "<", `\<`, ">", `\>`).Replace(f.Usage)
		b.WriteString("| `--" + f.Name + "` | `" + f.Env + "` | " + def + " | " + meaning + " |\n")
	}
	return b.String()
}

// The flag tables of docs/configuration.md are the flags' own: the test fails when a flag,
// its environment variable, its default or its help changes and the document does not.
// `go test ./cmd/agentd -run TestConfigurationDoc -update` rewrites the tables.
func TestConfigurationDoc(t *testing.T) {
	b, err := os.ReadFile(configurationDoc)
	require.NoError(t, err)
	doc := string(b)
	for _, c := range commandFlags() {
		begin := "<!-- BEGIN flags of " + c.name + ": generated from the code by `go test ./cmd/agentd -run TestConfigurationDoc -update` -->\n"
		end := "<!-- END flags of " + c.name + " -->"
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		require.True(t, i >= 0 && j > i, "%s has no table for %s between the lines\n%s%s", configurationDoc, c.name, begin, end)
		i += len(begin)
		want := flagTable(c.fs)
		if *update {
			doc = doc[:i] + want + doc[j:]
			continue
		}
		assert.Equal(t, want, doc[i:j], "the flags of %s differ from %s: run go test ./cmd/agentd -run TestConfigurationDoc -update", c.name, configurationDoc)
	}
	if *update {
		require.NoError(t, os.WriteFile(configurationDoc, []byte(doc), 0o644))
	}
}

// Every flag has an environment variable twin, its own within its command, and a flag
// both commands have is given by the same variable in both.
func TestEveryFlagHasAnEnvironmentVariable(t *testing.T) {
	envOf := map[string]string{}
	for _, c := range commandFlags() {
		flagOf := map[string]string{}
		for _, f := range flagenv.List(c.fs) {
			if !assert.NotEmpty(t, f.Env, "%s -%s has no environment variable", c.name, f.Name) {
				continue
			}
			assert.Empty(t, flagOf[f.Env], "%s: %s is the variable of both -%s and -%s", c.name, f.Env, flagOf[f.Env], f.Name)
			flagOf[f.Env] = f.Name
			if e, ok := envOf[f.Name]; ok {
				assert.Equal(t, e, f.Env, "-%s has different variables in different commands", f.Name)
			}
			envOf[f.Name] = f.Env
		}
	}
}

// -h lists every flag with its environment variable, and is not an error.
func TestHelpListsEveryVariable(t *testing.T) {
	for _, c := range commandFlags() {
		var out bytes.Buffer
		c.fs.SetOutput(&out)
		require.ErrorIs(t, flagenv.Parse(c.fs, []string{"-h"}), flag.ErrHelp)
		assert.Contains(t, out.String(), "usage: "+c.name+" [flags]")
		for _, f := range flagenv.List(c.fs) {
			assert.Contains(t, out.String(), "  -"+f.Name, c.name)
			assert.Contains(t, out.String(), "(env "+f.Env+")", c.name)
		}
	}
}

func noEnv(string) string { return "" }

// The defaults of `agentd operator` are what its components were always given.
func TestOperatorDefaults(t *testing.T) {
	var c operatorConfig
	require.NoError(t, flagenv.ParseEnv(c.flags(), nil, noEnv))
	assert.Equal(t, "buildkite", c.manager.namespace)
	assert.Equal(t, ":8080", c.manager.metricsAddr)
	assert.Equal(t, ":8081", c.manager.probeAddr)
	assert.True(t, c.manager.leaderElection)
	assert.Equal(t, "buildkite-operator", c.manager.leaderElectionID)
	assert.True(t, c.webhooks)
	assert.True(t, c.spawnerEnabled)

	assert.Equal(t, "bk-operator", c.spawner.Name)
	assert.Equal(t, "https://agent.buildkite.com/v3", c.spawner.Endpoint)
	assert.Equal(t, 10, c.spawner.Slots)
	assert.Equal(t, "bk-operator", c.spawner.Queue)
	assert.Equal(t, 2*time.Minute, c.spawner.CreateTimeout)
	assert.Equal(t, time.Minute, c.spawner.ReregisterAfter)

	co, wo := c.components()
	assert.Equal(t, "bk-operator/agentd:dev", co.OperatorImage)
	assert.Equal(t, corev1.PullIfNotPresent, co.OperatorImagePullPolicy)
	assert.Equal(t, "https://agent.buildkite.com/v3", co.AgentEndpoint)
	assert.Equal(t, "buildkite-operator/"+version, co.AgentAPI.UserAgent)
	assert.Equal(t, 30*time.Minute, co.UnschedulableTimeout)
	assert.Equal(t, 30*time.Second, co.ImagePullGrace)
	assert.Equal(t, 10*time.Minute, co.FailedPodRetention)
	assert.Equal(t, 5*time.Second, co.JobStatusInterval)

	assert.Equal(t, "buildkite", wo.Namespace)
	assert.Equal(t, "buildkite-operator-webhook", wo.ServiceName)
	assert.Equal(t, "buildkite-operator-webhook-tls", wo.SecretName)
	assert.Equal(t, "buildkite-operator", wo.WebhookConfigurationName)
	assert.True(t, wo.ManageCerts)
}

// Every flag of `agentd operator` is read from its variable, durations included, and the
// values shared between components reach each of them.
func TestOperatorEnvironment(t *testing.T) {
	env := map[string]string{
		"BK_OPERATOR_NAMESPACE":                 "ci",
		"BK_OPERATOR_LEADER_ELECT":              "false",
		"BK_OPERATOR_WEBHOOKS":                  "false",
		"BK_OPERATOR_MANAGE_WEBHOOK_CERTS":      "false",
		"BUILDKITE_AGENT_ENDPOINT":              "http://fake/v3",
		"BK_OPERATOR_DEFAULT_BUILD_ENVIRONMENT": "go",
		"BK_OPERATOR_TAGS":                      "cluster=a, os=linux",
		"BK_OPERATOR_REGISTRATION_TOKEN_SECRET": "agent-token/tok",
		"BK_OPERATOR_IMAGE_PULL_POLICY":         "Never",
		"BK_OPERATOR_UNSCHEDULABLE_TIMEOUT":     "1m",
		"BK_OPERATOR_IMAGE_PULL_GRACE":          "5s",
		"BK_OPERATOR_FAILED_POD_RETENTION":      "0s",
		"BK_OPERATOR_JOB_STATUS_INTERVAL":       "2s",
		"BK_OPERATOR_SLOTS":                     "",
	}
	var c operatorConfig
	fs := c.flags()
	require.NoError(t, flagenv.ParseEnv(fs, []string{"--image-pull-grace", "7s"}, func(k string) string { return env[k] }))
	require.NoError(t, c.spawner.FinishFlags(fs))
	assert.False(t, c.manager.leaderElection)
	assert.False(t, c.webhooks)
	assert.Equal(t, 10, c.spawner.Slots, "an empty variable counts as unset")
	assert.Equal(t, []string{"cluster=a", "os=linux"}, c.spawner.Tags)
	assert.Equal(t, &spawner.SecretKey{Name: "agent-token", Key: "tok"}, c.spawner.RegistrationTokenSecret)

	co, wo := c.components()
	assert.Equal(t, "http://fake/v3", co.AgentEndpoint)
	assert.Equal(t, "go", co.DefaultBuildEnvironment)
	assert.Equal(t, corev1.PullNever, co.OperatorImagePullPolicy)
	assert.Equal(t, time.Minute, co.UnschedulableTimeout)
	assert.Equal(t, 7*time.Second, co.ImagePullGrace, "the flag wins")
	assert.Equal(t, time.Duration(0), co.FailedPodRetention)
	assert.Equal(t, 2*time.Second, co.JobStatusInterval)
	assert.Equal(t, "ci", wo.Namespace)
	assert.Equal(t, "go", wo.DefaultBuildEnvironment)
	assert.Equal(t, "http://fake/v3", wo.AgentEndpoint, "BuildJobs may name only the operator's endpoint")
	assert.False(t, wo.ManageCerts)
}

// `agentd spawner` shares the namespace flag, and its variable, with `agentd operator`.
func TestSpawnerDefaultsAndNamespace(t *testing.T) {
	var c spawnerConfig
	require.NoError(t, flagenv.ParseEnv(c.flags(), nil, noEnv))
	assert.Equal(t, "buildkite", c.manager.namespace)
	assert.Equal(t, "0", c.manager.metricsAddr)
	assert.Equal(t, "0", c.manager.probeAddr)
	assert.False(t, c.manager.leaderElection)
	assert.Equal(t, 1.0, c.spawner.APIWaitScale)

	c = spawnerConfig{}
	require.NoError(t, flagenv.ParseEnv(c.flags(), []string{"-api-wait-scale", "0.01"}, func(k string) string {
		return map[string]string{"BK_OPERATOR_NAMESPACE": "ci", "KUBECONFIG": "/k"}[k]
	}))
	assert.Equal(t, "ci", c.manager.namespace)
	assert.Equal(t, "/k", c.kubeconfig)
	assert.Equal(t, 0.01, c.spawner.APIWaitScale)
}
