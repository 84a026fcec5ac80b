package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// Secrets as a BuildEnvironment or a pipeline would inject them.
const (
	dbPassword = "correct-horse-battery-staple"
	apiKey     = "sk_live_0123456789abcdef"
	shortToken = "none"
	notSecret  = "visible-value-1234"
)

// TestCommandRunnerRedacts: in Command mode the supervisor redacts as the agent does: the
// values of variables matching the redacted-vars patterns and the job token become
// [REDACTED] in the Buildkite log, also when a value is written in two pieces, also in
// log_paths files; short values and variables the patterns do not name stay.
func TestCommandRunnerRedacts(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		// command prints things; $LOGFILE is a log_paths file.
		command  string
		want     []string
		unwanted []string
	}{
		{
			name:     "the default patterns and the job token",
			command:  `env | sort; echo "db=$DB_PASSWORD key=$STRIPE_API_KEY short=$API_TOKEN plain=$PLAIN"`,
			want:     []string{"db=[REDACTED] key=[REDACTED] short=none plain=" + notSecret, "BUILDKITE_AGENT_ACCESS_TOKEN=[REDACTED]", "DB_PASSWORD=[REDACTED]"},
			unwanted: []string{dbPassword, apiKey},
		},
		{
			name:     "a value written in two pieces, with a pause between",
			command:  `printf 'pw=%s' "$(echo $DB_PASSWORD | cut -c1-9)"; sleep 0.5; printf '%s done\n' "$(echo $DB_PASSWORD | cut -c10-)"`,
			want:     []string{"pw=[REDACTED] done"},
			unwanted: []string{dbPassword, dbPassword[:9]},
		},
		{
			name:     "a log_paths file",
			command:  `echo "key in file: $STRIPE_API_KEY" > "$LOGFILE"; sleep 0.5; echo done`,
			want:     []string{"key in file: [REDACTED]"},
			unwanted: []string{apiKey},
		},
		{
			name:     "BUILDKITE_REDACTED_VARS replaces the defaults",
			env:      map[string]string{"BUILDKITE_REDACTED_VARS": "PLAIN, NOTHING_*"},
			command:  `echo "db=$DB_PASSWORD plain=$PLAIN token=$BUILDKITE_AGENT_ACCESS_TOKEN"`,
			want:     []string{"db=" + dbPassword + " plain=[REDACTED] token=[REDACTED]"},
			unwanted: []string{notSecret},
		},
		{
			name:    "short values are named in the log, not redacted",
			command: `echo "short=$API_TOKEN"`,
			want:    []string{"short=none", "API_TOKEN", "shorter than 6 bytes"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			logFile := filepath.Join(t.TempDir(), "app.log")
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(tt.command)})
			for k, v := range map[string]string{
				"DB_PASSWORD": dbPassword, "STRIPE_API_KEY": apiKey, "API_TOKEN": shortToken, "PLAIN": notSecret,
				"LOGFILE": logFile, podcontract.EnvLogPaths: logFile,
			} {
				h.env[k] = v
			}
			for k, v := range tt.env {
				h.env[k] = v
			}
			code := h.start("--finish").wait(t, 30*time.Second)
			log := fakebuildkite.PlainLog(h.snapshot().Log)
			t.Logf("log:\n%s", log)
			require.Equal(t, 0, code)
			for _, w := range tt.want {
				assert.Contains(t, log, w)
			}
			for _, u := range append(tt.unwanted, h.job.Token) {
				assert.NotContains(t, log, u)
			}
			assert.NotContains(t, log, "[REDACTED]]", "nothing redacted twice")
		})
	}
}

// TestBootstrapRunnerRedactsOnce: under buildkite-agent bootstrap, which redacts its own
// output, secrets and the job token come out as one [REDACTED] each, whether or not the
// environment sets BUILDKITE_REDACTED_VARS (the supervisor gives bootstrap the defaults, as
// buildkite-agent start does).
func TestBootstrapRunnerRedactsOnce(t *testing.T) {
	binDir := agentBinDir(t)
	repo, commits := gitRepo(t)
	tests := []struct {
		name string
		env  map[string]string
	}{
		{name: "default patterns"},
		{name: "patterns set by the environment", env: map[string]string{"BUILDKITE_REDACTED_VARS": "*_PASSWORD,*_TOKEN,*_API_KEY"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			command := `echo "db=$DB_PASSWORD key=$STRIPE_API_KEY token=$BUILDKITE_AGENT_ACCESS_TOKEN end"; ` +
				`printf 'split=%s' "$(echo $DB_PASSWORD | cut -c1-5)"; sleep 0.3; printf '%s end\n' "$(echo $DB_PASSWORD | cut -c6-)"`
			h := newHarness(t, fakebuildkite.Options{}, fakebuildkite.BuildRequest{
				PipelineYAML: pipeline(command), Repo: repo, Commit: commits["first"], Branch: "main",
			})
			h.env[podcontract.EnvRunner] = string(bkv1.RunnerBootstrap)
			h.env["GIT_CONFIG_GLOBAL"] = "/dev/null"
			h.env["PATH"] = binDir + ":" + os.Getenv("PATH")
			h.env["DB_PASSWORD"] = dbPassword
			h.env["STRIPE_API_KEY"] = apiKey
			for k, v := range tt.env {
				h.env[k] = v
			}
			code := h.start("--finish").wait(t, time.Minute)
			// bootstrap runs the command on a terminal, which ends lines with CRLF.
			log := strings.ReplaceAll(fakebuildkite.PlainLog(h.snapshot().Log), "\r\n", "\n")
			t.Logf("log:\n%s", log)
			require.Equal(t, 0, code)
			assert.Contains(t, log, "db=[REDACTED] key=[REDACTED] token=[REDACTED] end\n")
			assert.Contains(t, log, "split=[REDACTED] end\n")
			for _, secret := range []string{dbPassword, apiKey, h.job.Token} {
				assert.NotContains(t, log, secret)
			}
			assert.NotContains(t, log, "[REDACTED]]")
			assert.NotContains(t, log, "[[REDACTED]")
			assert.Equal(t, 4, strings.Count(log, "[REDACTED]"), "each secret printed once, redacted once")
		})
	}
}
