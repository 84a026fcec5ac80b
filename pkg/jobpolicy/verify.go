package jobpolicy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/buildkite/agent/v3/api"
	"github.com/buildkite/go-pipeline"
	"github.com/buildkite/go-pipeline/signature"
	"github.com/gowebpki/jcs"
)

// Job env variables the checks read.
const (
	envRepo     = "BUILDKITE_REPO"
	envCommand  = "BUILDKITE_COMMAND"
	envPlugins  = "BUILDKITE_PLUGINS"
	envMirror   = "BUILDKITE_GIT_REMOTE_MIRROR_URL"
	envSecrets  = "BUILDKITE_SECRETS_CONFIG"
	envCache    = "BUILDKITE_AGENT_CACHE_PATHS"
	envCompute  = "BUILDKITE_COMPUTE_TYPE"
	envTrace    = "BUILDKITE_TRACING_TRACEPARENT"
	envTraceSt  = "BUILDKITE_TRACING_TRACESTATE"
	envNSPrefix = signature.EnvNamespacePrefix
)

// The causes of a failed verification, in the words the agent logs them with: a job log
// reads the same whichever of the two ran the job.
var (
	errNoSignature = errors.New("job had no signature to verify")
	errNotVerified = errors.New("signature verification failed")
	errNotTheStep  = errors.New("job does not match signed step")
	errNoKeys      = errors.New("cannot verify signature. JWK for pipeline verification is not configured")
)

// invalidSignature is a signature that is there but does not hold: a wrong or unknown key,
// fields that changed, or a job that is not the signed step.
type invalidSignature struct{ cause error }

func (e invalidSignature) Error() string { return "invalid signature: " + e.cause.Error() }
func (e invalidSignature) Unwrap() error { return e.cause }

// verify checks job's signature, writing what the agent would print into log. refused is
// true, with msg saying why for the operator's explanation, when the job may not run.
func (p *Policy) verify(ctx context.Context, job *api.Job, log *strings.Builder) (refused bool, msg string) {
	sig := job.Step.Signature
	if p.keys == nil {
		if sig == nil {
			return false, "" // nothing to verify, nothing to verify with
		}
		// Without keys a signature cannot be checked. The agent prints this as a blocking
		// failure whatever the behaviour, and refuses the job under Block; under Warn it
		// runs it, without the line that says so.
		failureLines(log, Block, errNoKeys, "")
		if p.warn {
			return false, ""
		}
		return true, "its step is signed, but the operator has no keys to verify signatures with (--verification-jwks-file), and runs only jobs it can verify (--verification-failure-behavior block)."
	}
	err := verifyJob(ctx, job, p.keys)
	if err == nil {
		fmt.Fprintf(log, "~~~ ✅ Job signature verified\nsignature: %s\n", sig.Value)
		return false, ""
	}
	behavior := Block
	if p.warn {
		behavior = Warn
	}
	shown := ""
	if sig != nil {
		shown = sig.Value
	}
	failureLines(log, behavior, err, shown)
	if p.warn {
		return false, ""
	}
	what := "its signature could not be verified"
	if errors.Is(err, errNoSignature) {
		what = "its step is not signed"
	}
	return true, what + ", and the operator runs only jobs it can verify (--verification-failure-behavior block)."
}

// failureLines writes a failed verification into a job's log as the agent does: a heading
// that opens the section (⛔ when the job is refused, ⚠️ when it runs), the error, the
// signature or its absence, and whether the job runs regardless.
func failureLines(log *strings.Builder, behavior Behavior, err error, sig string) {
	mark := "⛔"
	if behavior == Warn {
		mark = "⚠️"
	}
	fmt.Fprintf(log, "+++ %s Job signature verification failed\nerror: %s\n", mark, err)
	var inv invalidSignature
	switch {
	case errors.Is(err, errNoSignature):
		log.WriteString("no signature in job\n")
	case errors.As(err, &inv):
		fmt.Fprintf(log, "signature: %s\n", sig)
	}
	if behavior == Warn {
		log.WriteString("Job will be run without verification\n")
	}
}

// verifyJob verifies job's step against its signature with keys, then that the job is the
// step that was signed, field by signed field, as the agent verifies a job. It returns
// errNoSignature for an unsigned step, an invalidSignature otherwise.
func verifyJob(ctx context.Context, job *api.Job, keys any) error {
	if job.Step.Signature == nil {
		return errNoSignature
	}
	// The matrix interpolation below rewrites the step's slices in place: work on a copy so
	// that the job keeps the step as Buildkite sent it.
	step, err := copyStep(&job.Step)
	if err != nil {
		return invalidSignature{errNotVerified}
	}
	err = signature.VerifyStep(ctx, step, keys, job.Env[envRepo], signature.WithEnv(job.Env))
	switch {
	case errors.Is(err, signature.ErrNoSignature):
		return errNoSignature
	case err != nil:
		// Which key, which field: the library's reasons stay out of the job's log, as the
		// agent keeps them out of its own.
		return invalidSignature{errNotVerified}
	}
	if err := step.InterpolateMatrixPermutation(job.MatrixPermutation); err != nil {
		return invalidSignature{errNotTheStep}
	}
	// The signature covers the step; the job runs from its env, which Buildkite made from
	// the step. Each signed field must have made it there unchanged, or someone changed the
	// job after it was signed.
	for _, field := range step.Signature.SignedFields {
		if !jobMatches(job, step, field) {
			return invalidSignature{errNotTheStep}
		}
	}
	return nil
}

// jobMatches reports whether job carries the signed field of step (matrix-interpolated) as
// signed. A field it does not know cannot be checked, and fails.
func jobMatches(job *api.Job, step *pipeline.CommandStep, field string) bool {
	switch field {
	case "command":
		return job.Env[envCommand] == step.Command
	case "env":
		// Every step variable is in the job's env with the step's value; the job's env has
		// more (the pipeline's, Buildkite's own), which the step does not sign.
		for name, want := range step.Env {
			if got, ok := job.Env[name]; !ok || got != want {
				return false
			}
		}
		return true
	case "plugins":
		return samePlugins(job.Env[envPlugins], step.Plugins)
	case "matrix", "repository_url", "secrets":
		// The matrix shows in the fields it interpolates; the repository was taken from the
		// job itself when the signature was checked; the secrets are the step's own, which
		// the signature covers, with nothing of the job's to compare them to.
		return true
	}
	if name, ok := strings.CutPrefix(field, envNSPrefix); ok {
		// A pipeline variable: its value was checked with the signature, from the job's
		// env; it must still be there.
		_, has := job.Env[name]
		return has
	}
	return false
}

// samePlugins compares BUILDKITE_PLUGINS with the step's plugins as canonical JSON (RFC
// 8785), every way of writing "no plugins" being the same.
func samePlugins(jobJSON string, stepPlugins pipeline.Plugins) bool {
	jobEmpty := jobJSON == "" || jobJSON == "null" || jobJSON == "[]"
	stepEmpty := len(stepPlugins) == 0
	if jobEmpty || stepEmpty {
		return jobEmpty == stepEmpty
	}
	stepJSON, err := json.Marshal(stepPlugins)
	if err != nil {
		return false
	}
	want, err := jcs.Transform(stepJSON)
	if err != nil {
		return false
	}
	got, err := jcs.Transform([]byte(jobJSON))
	return err == nil && bytes.Equal(got, want)
}

// copyStep copies a step deeply, through the JSON it came in as.
func copyStep(s *pipeline.CommandStep) (*pipeline.CommandStep, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encoding the job's step: %w", err)
	}
	var out pipeline.CommandStep
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("decoding the job's step: %w", err)
	}
	return &out, nil
}
