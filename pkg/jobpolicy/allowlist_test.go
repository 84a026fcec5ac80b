package jobpolicy_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobpolicy/jobpolicytest"
)

func TestAllowlists(t *testing.T) {
	const (
		docker   = `[{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0":{"image":"golang"}}]`
		shortcut = `[{"docker#v5.12.0":{"image":"golang"}}]`
		operator = `[{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0":{"build_environment":"go"}},"docker#v5.12.0"]`
		evil     = `["https://user:hunter2@git.example.com/evil/thing-buildkite-plugin.git#v1"]`
	)
	cases := []struct {
		name string
		cfg  jobpolicy.Config
		env  map[string]string
		// refused: the refusal's message has these; else the job runs.
		refused []string
		// log: what a job that runs has in its log, and env: what its env takes.
		log  string
		env2 map[string]string
	}{{
		name: "no allowlists allow everything",
		env:  map[string]string{"BUILDKITE_REPO": "git@evil.example:x.git", "FOO": "1", "BUILDKITE_PLUGINS": evil},
	}, {
		name: "a repository the list allows",
		cfg:  jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:other/`, `^git@github\.com:acme/`}},
		env:  map[string]string{"BUILDKITE_REPO": "git@github.com:acme/app.git"},
	}, {
		name:    "a repository the list does not allow",
		cfg:     jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:acme/`}},
		env:     map[string]string{"BUILDKITE_REPO": "git@github.com:evil/app.git"},
		refused: []string{"(--allowed-repositories)", `failed to validate repo: git@github.com:evil/app.git has no match in [^git@github\.com:acme/]`},
	}, {
		name:    "a repository's credentials stay out of the log",
		cfg:     jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:acme/`}},
		env:     map[string]string{"BUILDKITE_REPO": "https://bot:hunter2@git.example.com/app.git"},
		refused: []string{"failed to validate repo: https://bot:xxxxx@git.example.com/app.git has no match"},
	}, {
		name:    "a job without a repository under a repository allowlist",
		cfg:     jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:acme/`}},
		env:     map[string]string{},
		refused: []string{"failed to validate repo:  has no match"},
	}, {
		name: "plugins the list allows, in their full form",
		cfg:  jobpolicy.Config{AllowedPlugins: []string{`^github\.com/buildkite-plugins/docker-buildkite-plugin#`}},
		env:  map[string]string{"BUILDKITE_PLUGINS": shortcut},
	}, {
		name:    "a plugin the list does not allow",
		cfg:     jobpolicy.Config{AllowedPlugins: []string{`^github\.com/acme/`}},
		env:     map[string]string{"BUILDKITE_PLUGINS": docker},
		refused: []string{"(--allowed-plugins)", "failed to validate plugins: github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0 has no match in [^github\\.com/acme/]"},
	}, {
		name:    "the operator's own plugin needs no room in the list, the others do",
		cfg:     jobpolicy.Config{AllowedPlugins: []string{`^github\.com/acme/`}},
		env:     map[string]string{"BUILDKITE_PLUGINS": operator},
		refused: []string{"failed to validate plugins: github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0 has no match"},
	}, {
		name: "the operator's own plugin alone",
		cfg:  jobpolicy.Config{AllowedPlugins: []string{`^github\.com/acme/`}},
		env:  map[string]string{"BUILDKITE_PLUGINS": `[{"buildkite-operator#v0.1.0":{"build_environment":"go"}}]`},
	}, {
		name:    "a plugin's credentials stay out of the log",
		cfg:     jobpolicy.Config{AllowedPlugins: []string{`^github\.com/acme/`}},
		env:     map[string]string{"BUILDKITE_PLUGINS": evil},
		refused: []string{"https://user:xxxxx@git.example.com/evil/thing-buildkite-plugin.git#v1 has no match"},
	}, {
		name:    "plugins that cannot be read are refused",
		cfg:     jobpolicy.Config{AllowedPlugins: []string{`.*`}},
		env:     map[string]string{"BUILDKITE_PLUGINS": `{"not":"a list"`},
		refused: []string{"failed to validate plugins: failed to unmarshal plugins for validation: "},
	}, {
		name: "environment variables the list allows, and Buildkite's own",
		cfg:  jobpolicy.Config{EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{`^MYAPP_`}},
		env:  map[string]string{"BUILDKITE": "true", "CI": "true", "BUILDKITE_REPO": "x", "MYAPP_MODE": "fast"},
	}, {
		name:    "an environment variable the list does not allow",
		cfg:     jobpolicy.Config{EnableEnvironmentVariableAllowlist: true, AllowedEnvironmentVariables: []string{`^MYAPP_`}},
		env:     map[string]string{"MYAPP_MODE": "fast", "LD_PRELOAD": "/tmp/x.so", "ZZZ": "1"},
		refused: []string{"(--allowed-environment-variables)", `failed to validate environment variables: LD_PRELOAD has no match in [^BUILDKITE$ ^BUILDKITE_.*$ ^CI$ ^MYAPP_]`},
	}, {
		name:    "the environment allowlist on without a list allows Buildkite's own only",
		cfg:     jobpolicy.Config{EnableEnvironmentVariableAllowlist: true},
		env:     map[string]string{"BUILDKITE_REPO": "x", "CIRCLE": "1"},
		refused: []string{`failed to validate environment variables: CIRCLE has no match in [^BUILDKITE$ ^BUILDKITE_.*$ ^CI$]`},
	}, {
		name: "a remote mirror the repository list allows is kept",
		cfg:  jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:acme/`, `^https://mirror\.acme\.internal/`}},
		env:  map[string]string{"BUILDKITE_REPO": "git@github.com:acme/app.git", "BUILDKITE_GIT_REMOTE_MIRROR_URL": "https://mirror.acme.internal/app.git"},
	}, {
		name: "a remote mirror the repository list does not allow is dropped",
		cfg:  jobpolicy.Config{AllowedRepositories: []string{`^git@github\.com:acme/`}},
		env:  map[string]string{"BUILDKITE_REPO": "git@github.com:acme/app.git", "BUILDKITE_GIT_REMOTE_MIRROR_URL": "https://u:hunter2@mirror.example/app.git"},
		log:  "Remote Git mirror is not permitted by --allowed-repositories; using canonical repository: https://u:xxxxx@mirror.example/app.git\n",
		env2: map[string]string{"BUILDKITE_GIT_REMOTE_MIRROR_URL": ""},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := jobpolicy.New(tc.cfg)
			require.NoError(t, err)
			d := p.Check(context.Background(), &api.Job{ID: testJobID, Env: tc.env})
			if len(tc.refused) > 0 {
				assert.Equal(t, jobpolicy.RefusedAllowlist, d.Refusal)
				assert.Equal(t, "agent_refused", d.Refusal.SignalReason())
				for _, w := range tc.refused {
					assert.Contains(t, d.Message, w)
				}
				assert.NotContains(t, d.Message, "hunter2")
				return
			}
			require.Empty(t, d.Refusal, "refused: %s", d.Message)
			assert.Equal(t, tc.log, d.Log)
			want := tc.env2
			if want == nil {
				want = map[string]string{}
			}
			assert.Equal(t, want, d.Env)
		})
	}
}

// Under warn, a job that fails its verification and then an allowlist is refused by the
// allowlist, with the warning it had so far, in the order the agent prints them.
func TestAllowlistAfterAWarning(t *testing.T) {
	p, err := jobpolicy.New(jobpolicy.Config{
		VerificationJWKSFile:        jobpolicytest.WriteKeySet(t, jobpolicytest.NewKey(t, "k")),
		VerificationFailureBehavior: jobpolicy.Warn,
		AllowedRepositories:         []string{`^https://github\.com/acme/`},
	})
	require.NoError(t, err)
	job := makeJob(t, signedPipeline, nil, nil) // unsigned; its repository is testRepo
	d := p.Check(context.Background(), job)
	assert.Equal(t, jobpolicy.RefusedAllowlist, d.Refusal)
	assert.Contains(t, d.Message, warnedHeading+unsigned+runsAnyway+"failed to validate repo: "+testRepo+" has no match")
}

// A step's cache settings do nothing on a self-hosted agent, and the agent says so at the
// top of the job's log.
func TestCacheNote(t *testing.T) {
	const note = "+++ ⚠️ Cache settings detected on self-hosted agent\ncache paths: node_modules, vendor\n"
	cases := []struct {
		name string
		job  string
		want string
	}{
		{"self-hosted", `{"id":"j","env":{"BUILDKITE_COMPUTE_TYPE":"self-hosted"},"step":{"command":"x","cache":["node_modules","vendor"]}}`, note},
		{"hosted", `{"id":"j","env":{"BUILDKITE_COMPUTE_TYPE":"hosted"},"step":{"command":"x","cache":["node_modules","vendor"]}}`, ""},
		{"no cache", `{"id":"j","env":{"BUILDKITE_COMPUTE_TYPE":"self-hosted"},"step":{"command":"x"}}`, ""},
		{"cache off", `{"id":"j","env":{"BUILDKITE_COMPUTE_TYPE":"self-hosted"},"step":{"command":"x","cache":false}}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var job api.Job
			require.NoError(t, json.Unmarshal([]byte(tc.job), &job))
			p, err := jobpolicy.New(jobpolicy.Config{})
			require.NoError(t, err)
			d := p.Check(context.Background(), &job)
			require.Empty(t, d.Refusal)
			assert.Equal(t, tc.want, d.Log)
		})
	}
}
