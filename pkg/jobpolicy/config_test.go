package jobpolicy_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy/jobpolicytest"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  jobpolicy.Config
		want []string // in the error; none: valid
	}{
		{name: "nothing configured"},
		{name: "block", cfg: jobpolicy.Config{VerificationFailureBehavior: jobpolicy.Block}},
		{name: "warn", cfg: jobpolicy.Config{VerificationFailureBehavior: jobpolicy.Warn}},
		{name: "another behaviour", cfg: jobpolicy.Config{VerificationFailureBehavior: "allow"},
			want: []string{`--verification-failure-behavior "allow"`, `"block" or "warn"`}},
		{name: "a key id without a key set", cfg: jobpolicy.Config{VerificationJWKSKeyID: "k1"},
			want: []string{"--verification-jwks-key-id is set without --verification-jwks-file"}},
		{name: "expressions that compile", cfg: jobpolicy.Config{
			AllowedRepositories: []string{`^git@github\.com:acme/`}, AllowedPlugins: []string{`.*`},
			EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{`^MYAPP_`}}},
		{name: "a repository expression that does not compile", cfg: jobpolicy.Config{AllowedRepositories: []string{`^git@(`}},
			want: []string{"--allowed-repositories", `"^git@("`}},
		{name: "a plugin expression that does not compile", cfg: jobpolicy.Config{AllowedPlugins: []string{`[`}},
			want: []string{"--allowed-plugins", `"["`}},
		{name: "an environment expression that does not compile", cfg: jobpolicy.Config{EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{`*x`}},
			want: []string{"--allowed-environment-variables", `"*x"`}},
		{name: "environment variables without the allowlist on", cfg: jobpolicy.Config{AllowedEnvironmentVariables: []string{`^MYAPP_`}},
			want: []string{"--enable-environment-variable-allowlist is not"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			_, newErr := jobpolicy.New(tc.cfg)
			if len(tc.want) == 0 {
				assert.NoError(t, err)
				assert.NoError(t, newErr)
				return
			}
			require.Error(t, err)
			require.Error(t, newErr, "New checks what Validate checks")
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestLoadKeys(t *testing.T) {
	k1 := jobpolicytest.NewKey(t, "k1")
	const private = `{"keys":[{"kty":"oct","k":"c2VjcmV0LWtleS1tYXRlcmlhbA","alg":"HS256","kid":"h"}]}`
	cases := []struct {
		name  string
		path  string
		keyID string
		want  []string // in the error; none: loads
	}{
		{name: "a key set", path: jobpolicytest.WriteKeySet(t, k1)},
		{name: "a key set and the id of one of its keys", path: jobpolicytest.WriteKeySet(t, k1), keyID: "k1"},
		{name: "an id the set does not have", path: jobpolicytest.WriteKeySet(t, k1), keyID: "k9",
			want: []string{`no key with id "k9"`, "--verification-jwks-key-id"}},
		{name: "no file", path: filepath.Join(t.TempDir(), "missing.json"),
			want: []string{"reading the verification key set (--verification-jwks-file)", "no such file"}},
		{name: "not a key set", path: writeFile(t, `{"keys": "c2VjcmV0"`),
			want: []string{"is not a JSON Web Key Set"}},
		{name: "an empty key set", path: writeFile(t, `{"keys":[]}`),
			want: []string{"has no keys"}},
		{name: "a key without an algorithm", path: writeFile(t, `{"keys":[{"kty":"oct","k":"c2VjcmV0LWtleS1tYXRlcmlhbA"}]}`),
			want: []string{`key 0 of the verification key set`, `has no "alg"`}},
		{name: "a shared secret", path: writeFile(t, private)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := jobpolicy.New(jobpolicy.Config{VerificationJWKSFile: tc.path, VerificationJWKSKeyID: tc.keyID})
			if len(tc.want) == 0 {
				require.NoError(t, err)
				require.NotNil(t, p)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "c2VjcmV0", "the file's content stays out of the error")
		})
	}
}

// A nil Policy, as a Spawner configured without one holds, still refuses a signed job: it
// has nothing to verify it with.
func TestNilPolicy(t *testing.T) {
	var p *jobpolicy.Policy
	signed := makeJob(t, signedPipeline, jobpolicytest.NewKey(t, "k"), nil)
	assert.Equal(t, jobpolicy.RefusedSignature, p.Check(context.Background(), signed).Refusal)
	unsigned := makeJob(t, signedPipeline, nil, nil)
	d := p.Check(context.Background(), unsigned)
	assert.Empty(t, d.Refusal)
	assert.Empty(t, d.Log)
}
