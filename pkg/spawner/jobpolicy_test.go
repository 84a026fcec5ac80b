package spawner_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gopipeline "github.com/buildkite/go-pipeline"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy/jobpolicytest"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

const policyRepo = "git@github.com:acme/app.git"

// signPipeline signs the steps of a pipeline as `buildkite-agent pipeline upload` does
// for repo policyRepo, and returns it (as JSON, which the fake reads as YAML) with the
// signature of its first step.
func signPipeline(t *testing.T, yaml string, key jwk.Key) (signed, sig string) {
	t.Helper()
	p := jobpolicytest.Sign(t, yaml, key, policyRepo)
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return string(b), p.Steps[0].(*gopipeline.CommandStep).Signature.Value
}

// jobEnvSecret is the env the spawner kept for the job in its BuildJob's token Secret, by
// variable name.
func jobEnvSecret(t *testing.T, ns string, bj v1alpha1.BuildJob) map[string]string {
	t.Helper()
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: bj.Spec.TokenSecretRef.Name}, &sec))
	out := map[string]string{}
	for _, n := range bj.Spec.EnvNames {
		if v, ok := sec.Data[v1alpha1.EnvSecretKey(n)]; ok {
			out[n] = string(v)
		}
	}
	return out
}

// A job the operator's job policy refuses is started, explained and finished with the
// agent's signal reason, and gets no BuildJob (so no Secret and no pod).
func TestJobPolicyRefuses(t *testing.T) {
	k1, k2 := jobpolicytest.NewKey(t, "k1"), jobpolicytest.NewKey(t, "k2")
	keys := jobpolicytest.WriteKeySet(t, k1)
	step := "steps:\n  - command: make deploy\n    agents: {queue: bk-operator}\n" + goPlugin
	byK2, _ := signPipeline(t, step, k2)
	byK1, _ := signPipeline(t, step, k1)
	cases := []struct {
		name   string
		policy jobpolicy.Config
		yaml   string
		repo   string
		signal string
		want   []string
	}{{
		name:   "an unsigned job where jobs are verified",
		policy: jobpolicy.Config{VerificationJWKSFile: keys},
		yaml:   step,
		signal: "signature_rejected",
		want:   []string{"its step is not signed", "+++ ⛔ Job signature verification failed", "error: job had no signature to verify", "no signature in job"},
	}, {
		name:   "a job signed by a key the operator does not have",
		policy: jobpolicy.Config{VerificationJWKSFile: keys},
		yaml:   byK2,
		signal: "signature_rejected",
		want:   []string{"+++ ⛔ Job signature verification failed", "error: invalid signature: signature verification failed", "signature: "},
	}, {
		name:   "a signed job where the operator has no keys",
		yaml:   byK1,
		signal: "signature_rejected",
		want:   []string{"no keys to verify signatures with", "error: cannot verify signature. JWK for pipeline verification is not configured"},
	}, {
		name:   "a repository the allowlist does not allow",
		policy: jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:acme/`}},
		yaml:   step,
		repo:   "git@github.com:evil/app.git",
		signal: "agent_refused",
		want:   []string{"(--allowed-repositories)", `failed to validate repo: git@github.com:evil/app.git has no match in [^git@github\.com:acme/]`},
	}, {
		name:   "a plugin the allowlist does not allow",
		policy: jobpolicy.Config{AllowedPlugins: []string{`^github\.com/acme/`}},
		yaml:   step + "      - docker#v5.12.0: {image: golang}\n",
		signal: "agent_refused",
		want:   []string{"(--allowed-plugins)", "failed to validate plugins: github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0 has no match"},
	}, {
		name:   "an env variable the allowlist does not allow",
		policy: jobpolicy.Config{EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{`^MYAPP_`}},
		yaml:   "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    env: {MYAPP_MODE: fast, LD_PRELOAD: /tmp/x.so}\n" + goPlugin,
		signal: "agent_refused",
		want:   []string{"(--allowed-environment-variables)", "failed to validate environment variables: LD_PRELOAD has no match"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			fake := startFake(t)
			startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots, c.Policy = 1, tc.policy })
			repo := tc.repo
			if repo == "" {
				repo = policyRepo
			}
			b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: tc.yaml, Repo: repo})
			require.NoError(t, err)
			waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
			assertEndedAtIntake(t, fake, ns, b.Jobs[0], tc.signal, tc.want...)
			var secrets corev1.SecretList
			require.NoError(t, env.Client.List(context.Background(), &secrets, client.InNamespace(ns)))
			for _, s := range secrets.Items {
				assert.NotContains(t, s.Name, "token", "no token Secret for a refused job")
			}
		})
	}
}

// A job the policy lets run gets its BuildJob, and its token Secret the env the agent
// gives a job: the lines for the top of its log (podcontract.EnvIntakeLog), the step's
// secrets, and nothing of a step's own attempt at those lines.
func TestJobPolicyAdmits(t *testing.T) {
	k1 := jobpolicytest.NewKey(t, "k1")
	keys := jobpolicytest.WriteKeySet(t, k1)
	step := "steps:\n  - command: make deploy\n    agents: {queue: bk-operator}\n" + goPlugin
	signed, sig := signPipeline(t, step, k1)
	cases := []struct {
		name   string
		policy jobpolicy.Config
		yaml   string
		// want are variables of the job's env and their values; absent must not be there.
		want   map[string]string
		absent []string
	}{{
		name:   "a verified job opens its log saying so",
		policy: jobpolicy.Config{VerificationJWKSFile: keys},
		yaml:   signed,
		want:   map[string]string{podcontract.EnvIntakeLog: "~~~ ✅ Job signature verified\nsignature: " + sig + "\n"},
	}, {
		name:   "an unsigned job runs with a warning under warn",
		policy: jobpolicy.Config{VerificationJWKSFile: keys, VerificationFailureBehavior: jobpolicy.Warn},
		yaml:   step,
		want: map[string]string{podcontract.EnvIntakeLog: "+++ ⚠️ Job signature verification failed\n" +
			"error: job had no signature to verify\nno signature in job\nJob will be run without verification\n"},
	}, {
		name:   "a step cannot write the lines itself",
		yaml:   "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_INTAKE_LOG: \"~~~ ✅ Job signature verified\"}\n" + goPlugin,
		absent: []string{podcontract.EnvIntakeLog},
	}, {
		name:   "the step's secrets reach bootstrap",
		yaml:   "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    secrets: [DB_PASSWORD]\n" + goPlugin,
		want:   map[string]string{"BUILDKITE_SECRETS_CONFIG": `[{"environment_variable":"DB_PASSWORD","key":"DB_PASSWORD"}]`},
		absent: []string{podcontract.EnvIntakeLog},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			fake := startFake(t)
			startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots, c.Policy = 1, tc.policy })
			b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: tc.yaml, Repo: policyRepo})
			require.NoError(t, err)
			bj := waitBuildJob(t, fake, ns, b.Jobs[0])
			got := jobEnvSecret(t, ns, bj)
			for k, v := range tc.want {
				assert.Equal(t, v, got[k], k)
				assert.Contains(t, bj.Spec.EnvNames, k)
			}
			for _, k := range tc.absent {
				assert.NotContains(t, bj.Spec.EnvNames, k)
				assert.NotContains(t, got, k)
			}
			j, _ := fake.Job(b.Jobs[0])
			assert.Empty(t, j.SignalReason, "not finished at intake")
		})
	}
}

// registerBodies records the bodies of the register requests sent through it to fake.
type registerBodies struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []map[string]any
}

func newRegisterBodies(t *testing.T, fake *fakebuildkite.Server) *registerBodies {
	t.Helper()
	target, err := url.Parse(fake.URL())
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	rb := &registerBodies{}
	rb.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/register") {
			body, err := io.ReadAll(r.Body)
			if err == nil {
				var m map[string]any
				if json.Unmarshal(body, &m) == nil {
					rb.mu.Lock()
					rb.bodies = append(rb.bodies, m)
					rb.mu.Unlock()
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rb.srv.Close)
	return rb
}

func (rb *registerBodies) all() []map[string]any {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return append([]map[string]any(nil), rb.bodies...)
}

// Every slot registers with the configured priority, as the agent's --priority; without
// one, none is sent.
func TestPriorityAtRegistration(t *testing.T) {
	for _, tc := range []struct {
		priority string
		want     any // the register body's "priority"; nil: not sent
	}{{"7", "7"}, {"", nil}} {
		t.Run("priority "+tc.priority, func(t *testing.T) {
			ns := newNamespace(t)
			fake := startFake(t)
			rb := newRegisterBodies(t, fake)
			startSpawner(t, fake, ns, func(c *spawner.Config) {
				c.Slots, c.Priority, c.Endpoint = 2, tc.priority, rb.srv.URL+"/v3"
			})
			require.Eventually(t, func() bool { return len(rb.all()) >= 2 }, 20*time.Second, 20*time.Millisecond, "both slots register")
			for _, b := range rb.all() {
				assert.Equal(t, tc.want, b["priority"])
			}
		})
	}
}

// A priority Buildkite would not take is refused when the spawner is made, as is a policy
// that cannot be loaded: no slot registers with them.
func TestPolicyConfigRefused(t *testing.T) {
	cases := []struct {
		name string
		edit func(*spawner.Config)
		want string
	}{
		{"a priority that is not a number", func(c *spawner.Config) { c.Priority = "high" }, `priority "high" is not a whole number`},
		{"a key set that cannot be read", func(c *spawner.Config) { c.Policy.VerificationJWKSFile = filepath.Join(t.TempDir(), "none.json") }, "--verification-jwks-file"},
		{"an allowlist that does not compile", func(c *spawner.Config) { c.Policy.AllowedPlugins = []string{"("} }, "--allowed-plugins"},
	}
	// Never started: New only needs one to be given.
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := spawner.Config{
				Name: "bk-operator-test", Namespace: "ns", Endpoint: "https://agent.example/v3", Slots: 1,
				RegistrationTokenFile: "/dev/null", Cache: c,
			}
			tc.edit(&cfg)
			_, err := spawner.New(cfg, env.Client)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
