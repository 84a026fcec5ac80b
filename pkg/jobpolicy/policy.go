// Package jobpolicy holds what an agent that accepts a job checks before the job's
// bootstrap runs (the JobRunner of `buildkite-agent start`): the job's signature (signed
// pipelines, with the agent's --verification-jwks-file and --verification-failure-behavior),
// the allowlists (--allowed-repositories, --allowed-plugins, --allowed-environment-variables),
// and the values the agent adds to the job's env from the job itself (its step's secrets, its
// trace context).
//
// The spawner asks Check about every job it accepts, before anything of the job exists in
// Kubernetes: the job runs, perhaps with lines for its log that the agent would print before
// bootstrap, or it is refused with the signal reason the agent gives, and never reaches a pod.
package jobpolicy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/buildkite/agent/v3/api"
	"github.com/lestrrat-go/jwx/v3/jwk"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
)

// Behavior is what happens to a job whose signature cannot be verified: the agent's
// --verification-failure-behavior.
type Behavior string

// The agent's two behaviours; Block is its default.
const (
	// Block refuses the job (signal reason signature_rejected).
	Block Behavior = "block"
	// Warn runs it, with a warning at the top of its log.
	Warn Behavior = "warn"
)

// Config is what a platform team configures, as the agent's flags of the same names take it.
type Config struct {
	// VerificationJWKSFile is a JSON Web Key Set whose keys verify job signatures. Empty:
	// jobs are not verified, and a signed job is refused (under Block).
	VerificationJWKSFile string
	// VerificationJWKSKeyID narrows the set to its key of this id: a signature by any
	// other key of the file is one from an unknown key. Empty: every key of the file.
	VerificationJWKSKeyID string
	// VerificationFailureBehavior is Block when empty.
	VerificationFailureBehavior Behavior

	// AllowedRepositories, AllowedPlugins and AllowedEnvironmentVariables are regular
	// expressions (Go syntax, unanchored, as the agent compiles them). An empty list allows
	// everything.
	AllowedRepositories []string
	AllowedPlugins      []string
	// EnableEnvironmentVariableAllowlist turns the environment variable allowlist on: a
	// job then runs only when the name of every variable of its env matches one of
	// AllowedEnvironmentVariables or is one Buildkite sets (BUILDKITE, BUILDKITE_*, CI).
	// The agent requires it for AllowedEnvironmentVariables, and so does Validate.
	EnableEnvironmentVariableAllowlist bool
	AllowedEnvironmentVariables        []string
}

// Validate checks what can be checked without reading the key set: the behaviour, the
// expressions, and settings that need another. Each error names the agent flag to fix.
func (c Config) Validate() error {
	var errs []error
	switch c.VerificationFailureBehavior {
	case "", Block, Warn:
	default:
		errs = append(errs, fmt.Errorf("--verification-failure-behavior %q: give %q or %q", c.VerificationFailureBehavior, Block, Warn))
	}
	if c.VerificationJWKSKeyID != "" && c.VerificationJWKSFile == "" {
		errs = append(errs, errors.New("--verification-jwks-key-id is set without --verification-jwks-file: name the key set the key is in"))
	}
	for _, l := range []struct {
		flag     string
		patterns []string
	}{
		{"--allowed-repositories", c.AllowedRepositories},
		{"--allowed-plugins", c.AllowedPlugins},
		{"--allowed-environment-variables", c.AllowedEnvironmentVariables},
	} {
		if _, err := compile(l.flag, l.patterns); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.AllowedEnvironmentVariables) > 0 && !c.EnableEnvironmentVariableAllowlist {
		// As the agent refuses to start: a list that is silently not applied would let
		// through every variable its author meant to keep out.
		errs = append(errs, errors.New("--allowed-environment-variables is set but --enable-environment-variable-allowlist is not: turn the allowlist on, or drop the list"))
	}
	return errors.Join(errs...)
}

// Policy is a loaded Config. Its zero value (and nil) verifies nothing and allows
// everything but a signed job, which it refuses: it has no keys to verify it with.
type Policy struct {
	// keys verify signatures; nil when no key set is configured.
	keys jwk.Set
	// warn: Behavior Warn.
	warn bool
	// repos, plugins and envs are the allowlists; nil allows everything. envs, when the
	// environment variable allowlist is on, begins with the names Buildkite sets.
	repos, plugins, envs []*regexp.Regexp
}

// New checks c and loads it: the key set is read once, as the agent reads it when it starts
// (a changed file takes effect when the operator restarts).
func New(c Config) (*Policy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	p := &Policy{warn: c.VerificationFailureBehavior == Warn}
	// Validate compiled them already: no errors here.
	p.repos, _ = compile("", c.AllowedRepositories)
	p.plugins, _ = compile("", c.AllowedPlugins)
	if c.EnableEnvironmentVariableAllowlist {
		own, _ := compile("", c.AllowedEnvironmentVariables)
		p.envs = append(append([]*regexp.Regexp{}, buildkiteEnv...), own...)
	}
	if c.VerificationJWKSFile != "" {
		keys, err := loadKeys(c.VerificationJWKSFile, c.VerificationJWKSKeyID)
		if err != nil {
			return nil, err
		}
		p.keys = keys
	}
	return p, nil
}

// buildkiteEnv are the variables Buildkite sets in every job, which the environment
// variable allowlist always lets through, as the agent's does.
var buildkiteEnv = []*regexp.Regexp{
	regexp.MustCompile(`^BUILDKITE$`),
	regexp.MustCompile(`^BUILDKITE_.*$`),
	regexp.MustCompile(`^CI$`),
}

// compile compiles an allowlist's expressions; the error names flag and the expression.
func compile(flag string, patterns []string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	var errs []error
	for _, s := range patterns {
		re, err := regexp.Compile(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a regular expression: %w", flag, s, err))
			continue
		}
		out = append(out, re)
	}
	return out, errors.Join(errs...)
}

// loadKeys reads a JSON Web Key Set as the agent checks it when it starts: it must have
// keys, each with its algorithm ("alg"), the one the signature names. keyID narrows it to
// that key, which must be in the file.
func loadKeys(path, keyID string) (jwk.Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the verification key set (--verification-jwks-file): %w", err)
	}
	set, err := jwk.Parse(b)
	if err != nil {
		// The parser's message may quote the file, which may hold a private key: not
		// repeated here.
		return nil, fmt.Errorf("the verification key set %s (--verification-jwks-file) is not a JSON Web Key Set", path)
	}
	if set.Len() == 0 {
		return nil, fmt.Errorf("the verification key set %s (--verification-jwks-file) has no keys", path)
	}
	for i := range set.Len() {
		key, _ := set.Key(i)
		if _, ok := key.Algorithm(); !ok {
			return nil, fmt.Errorf("key %d of the verification key set %s (--verification-jwks-file) has no \"alg\": give every key the algorithm it verifies, such as ES256 or EdDSA", i, path)
		}
	}
	if keyID == "" {
		return set, nil
	}
	key, ok := set.LookupKeyID(keyID)
	if !ok {
		return nil, fmt.Errorf("the verification key set %s (--verification-jwks-file) has no key with id %q (--verification-jwks-key-id)", path, keyID)
	}
	one := jwk.NewSet()
	if err := one.AddKey(key); err != nil {
		return nil, fmt.Errorf("keeping key %q of the verification key set: %w", keyID, err)
	}
	return one, nil
}

// Refusal is why a job may not run; "" when it may.
type Refusal string

// The refusals, as the agent finishes such a job.
const (
	// RefusedSignature: its signature was missing, invalid, by an unknown key or not the
	// step's, under Block; or it is signed and there are no keys to verify it with.
	RefusedSignature Refusal = "signature"
	// RefusedAllowlist: a repository, plugin or env variable the allowlists do not allow.
	RefusedAllowlist Refusal = "allowlist"
)

// SignalReason is the signal reason of the finish of a job refused so, as the agent gives
// it: the step's automatic retry rules match on it.
func (r Refusal) SignalReason() string {
	switch r {
	case RefusedSignature:
		return agentapi.SignalReasonSignatureRejected
	case RefusedAllowlist:
		return agentapi.SignalReasonAgentRefused
	}
	return ""
}

// Decision is what Check made of a job.
type Decision struct {
	// Refusal is why the job may not run; "" when it runs.
	Refusal Refusal
	// Message explains a refusal, for the job's log: what refused it, then the lines the
	// agent would print. It does not end with a newline.
	Message string
	// Log is, for a job that runs, what the agent prints in its log before bootstrap's
	// output ("" for nothing): the signature verified, or a warning that it was not.
	Log string
	// Env holds the values the job's env takes before it runs, "" included (a remote
	// mirror the repository allowlist does not allow is emptied, as the agent empties it).
	Env map[string]string
}

// Check applies the policy to an accepted job, as the agent's JobRunner does before
// bootstrap: the signature first, then (after a note on cache settings, which a self-hosted
// agent ignores) the allowlists. job is not changed.
func (p *Policy) Check(ctx context.Context, job *api.Job) Decision {
	if p == nil {
		p = &Policy{}
	}
	var log strings.Builder
	if refused, msg := p.verify(ctx, job, &log); refused {
		return Decision{Refusal: RefusedSignature, Message: msg + "\n" + strings.TrimSuffix(log.String(), "\n")}
	}
	if c := job.Step.Cache; c != nil && !c.Disabled && len(c.Paths) > 0 && job.Env[envCompute] == "self-hosted" {
		// Buildkite's cache volumes are for its hosted agents: on a self-hosted one the
		// step's cache settings do nothing, and the agent says so.
		fmt.Fprintf(&log, "+++ ⚠️ Cache settings detected on self-hosted agent\ncache paths: %s\n", strings.Join(c.Paths, ", "))
	}
	if flag, line := p.allowlists(job); line != "" {
		return Decision{Refusal: RefusedAllowlist, Message: fmt.Sprintf(
			"the operator's allowlist (%s) does not allow it; a platform team changes the allowlist, a pipeline author the step.\n%s%s",
			flag, log.String(), strings.TrimSuffix(line, "\n"))}
	}
	env := map[string]string{}
	if mirror, ok := job.Env[envMirror]; ok && mirror != "" && !matchAny(p.repos, mirror) {
		// The agent clones from the canonical repository instead, and says so.
		env[envMirror] = ""
		fmt.Fprintf(&log, "Remote Git mirror is not permitted by --allowed-repositories; using canonical repository: %s\n", redactURL(mirror))
	}
	return Decision{Log: log.String(), Env: env}
}
