package spawner

import (
	"encoding/json"
	"flag"
	"maps"
	"testing"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// The job policy's refusals finish their jobs with the agent's signal reasons, also when a
// resumed slot reads the failure back from its Secret.
func TestPolicyFailures(t *testing.T) {
	cases := []struct {
		refusal jobpolicy.Refusal
		failure IntakeFailure
		signal  string
	}{
		{jobpolicy.RefusedSignature, IntakeSignatureRejected, agentapi.SignalReasonSignatureRejected},
		{jobpolicy.RefusedAllowlist, IntakeNotAllowed, agentapi.SignalReasonAgentRefused},
	}
	for _, tc := range cases {
		t.Run(string(tc.failure), func(t *testing.T) {
			f := refusalFailure(tc.refusal)
			assert.Equal(t, tc.failure, f)
			assert.Equal(t, tc.signal, f.signalReason())
			assert.Equal(t, tc.signal, tc.refusal.SignalReason(), "the policy and the spawner agree")
			assert.False(t, f.mayHaveRun(), "a refused job never ran: its explanation opens its log")

			var st slotState
			st.fail(&intakeError{f, "why\nand more"})
			back := stateFromData(st.data())
			reason, msg := back.failure()
			assert.Equal(t, tc.signal, reason.signalReason())
			assert.Equal(t, "why\nand more", msg)
		})
	}
}

func TestJobToRun(t *testing.T) {
	const trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	cases := []struct {
		name     string
		job      string // the accept response
		decision jobpolicy.Decision
		want     map[string]string // the env the job runs with
	}{{
		name: "nothing to add",
		job:  `{"id":"j","env":{"A":"1"},"step":{"command":"x"}}`,
		want: map[string]string{"A": "1"},
	}, {
		name:     "the policy's lines for the log",
		job:      `{"id":"j","env":{"A":"1"},"step":{"command":"x"}}`,
		decision: jobpolicy.Decision{Log: "~~~ ✅ Job signature verified\nsignature: s\n"},
		want:     map[string]string{"A": "1", podcontract.EnvIntakeLog: "~~~ ✅ Job signature verified\nsignature: s\n"},
	}, {
		name: "a step's own lines are dropped",
		job:  `{"id":"j","env":{"A":"1","BK_OPERATOR_INTAKE_LOG":"~~~ ✅ Job signature verified"},"step":{"command":"x"}}`,
		want: map[string]string{"A": "1"},
	}, {
		name:     "a step's own lines are replaced",
		job:      `{"id":"j","env":{"BK_OPERATOR_INTAKE_LOG":"forged"},"step":{"command":"x"}}`,
		decision: jobpolicy.Decision{Log: "real\n"},
		want:     map[string]string{podcontract.EnvIntakeLog: "real\n"},
	}, {
		name:     "the policy's values win over the job's",
		job:      `{"id":"j","env":{"BUILDKITE_GIT_REMOTE_MIRROR_URL":"https://mirror.example/x"},"step":{"command":"x"}}`,
		decision: jobpolicy.Decision{Env: map[string]string{"BUILDKITE_GIT_REMOTE_MIRROR_URL": ""}},
		want:     map[string]string{"BUILDKITE_GIT_REMOTE_MIRROR_URL": ""},
	}, {
		name: "secrets and trace context, over the job's own values",
		job: `{"id":"j","env":{"BUILDKITE_SECRETS_CONFIG":"[]"},"step":{"command":"x","secrets":["DB_PASSWORD"]},` +
			`"traceparent":"` + trace + `","tracestate":"bk=1"}`,
		want: map[string]string{
			"BUILDKITE_SECRETS_CONFIG":      `[{"environment_variable":"DB_PASSWORD","key":"DB_PASSWORD"}]`,
			"BUILDKITE_TRACING_TRACEPARENT": trace,
			"BUILDKITE_TRACING_TRACESTATE":  "bk=1",
		},
	}, {
		name: "a job without env",
		job:  `{"id":"j","step":{"command":"x"}}`,
		want: map[string]string{},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var job api.Job
			require.NoError(t, json.Unmarshal([]byte(tc.job), &job))
			before := maps.Clone(job.Env)
			run, ie := jobToRun(&job, tc.decision)
			require.Nil(t, ie)
			assert.Equal(t, tc.want, run.Env)
			assert.Equal(t, before, job.Env, "the job as Buildkite sent it is left alone")
			assert.Equal(t, job.ID, run.ID)
		})
	}
}

// The policy's flags fill Config.Policy and Priority from flags or the agent's variables;
// lists add up across flags, as the agent's do; FinishFlags refuses what cannot work.
func TestPolicyFlags(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    jobpolicy.Config
		prio    string
		wantErr string
	}{{
		name: "defaults",
		want: jobpolicy.Config{VerificationFailureBehavior: jobpolicy.Block},
	}, {
		name: "flags",
		args: []string{"--verification-jwks-file=/k/jwks.json", "--verification-jwks-key-id=k1", "--verification-failure-behavior=warn",
			"--allowed-repositories=^a,^b", "--allowed-repositories=^c", "--allowed-plugins=^p",
			"--enable-environment-variable-allowlist", "--allowed-environment-variables=^MYAPP_", "--priority=3"},
		want: jobpolicy.Config{VerificationJWKSFile: "/k/jwks.json", VerificationJWKSKeyID: "k1", VerificationFailureBehavior: jobpolicy.Warn,
			AllowedRepositories: []string{"^a", "^b", "^c"}, AllowedPlugins: []string{"^p"},
			EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{"^MYAPP_"}},
		prio: "3",
	}, {
		name: "the agent's variables",
		env: map[string]string{
			"BUILDKITE_AGENT_VERIFICATION_JWKS_FILE":                 "/k/jwks.json",
			"BUILDKITE_AGENT_VERIFICATION_JWKS_KEY_ID":               "k1",
			"BUILDKITE_AGENT_JOB_VERIFICATION_NO_SIGNATURE_BEHAVIOR": "warn",
			"BUILDKITE_ALLOWED_REPOSITORIES":                         "^a, ^b",
			"BUILDKITE_ALLOWED_PLUGINS":                              "^p",
			"BUILDKITE_ENABLE_ENVIRONMENT_VARIABLE_ALLOWLIST":        "true",
			"BUILDKITE_ALLOWED_ENVIRONMENT_VARIABLES":                "^MYAPP_",
			"BUILDKITE_AGENT_PRIORITY":                               "-2",
		},
		want: jobpolicy.Config{VerificationJWKSFile: "/k/jwks.json", VerificationJWKSKeyID: "k1", VerificationFailureBehavior: jobpolicy.Warn,
			AllowedRepositories: []string{"^a", "^b"}, AllowedPlugins: []string{"^p"},
			EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{"^MYAPP_"}},
		prio: "-2",
	}, {
		name:    "a behaviour the agent does not have",
		args:    []string{"--verification-failure-behavior=allow"},
		wantErr: "--verification-failure-behavior",
	}, {
		name:    "an expression that does not compile",
		args:    []string{"--allowed-repositories=^git@("},
		wantErr: "--allowed-repositories",
	}, {
		name:    "environment variables without the allowlist on",
		args:    []string{"--allowed-environment-variables=^MYAPP_"},
		wantErr: "--enable-environment-variable-allowlist",
	}, {
		name:    "a priority that is not a number",
		args:    []string{"--priority=high"},
		wantErr: `priority "high"`,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			c.BindFlags(fs)
			args := append([]string{"--registration-token-file=/dev/null"}, tc.args...)
			require.NoError(t, flagenv.ParseEnv(fs, args, func(k string) string { return tc.env[k] }))
			err := c.FinishFlags(fs)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, c.Policy)
			assert.Equal(t, tc.prio, c.Priority)
		})
	}
}
