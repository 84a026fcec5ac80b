package plugin

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func i32(n int32) *int32 { return &n }

// pluginsJSON builds BUILDKITE_PLUGINS with one entry per (source, config) pair,
// as the backend sends it. A nil config gives `null`.
func pluginsJSON(t *testing.T, pairs ...any) string {
	t.Helper()
	var list []map[string]any
	for i := 0; i < len(pairs); i += 2 {
		list = append(list, map[string]any{pairs[i].(string): pairs[i+1]})
	}
	b, err := json.Marshal(list)
	require.NoError(t, err)
	return string(b)
}

func TestIsOperatorSource(t *testing.T) {
	for _, tc := range []struct {
		source string
		want   bool
	}{
		// the canonical forms the backend writes
		{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v1.0.0", true},
		{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin", true},
		{"github.com/my-org/buildkite-operator-buildkite-plugin#v0.1.0", true},
		// shorthand as written in a pipeline
		{"buildkite-operator#v1.0.0", true},
		{"buildkite-operator", true},
		{"my-org/buildkite-operator#v1.0.0", true},
		{"Buildkite-Operator#v1", true},
		// full git URLs, with and without .git and the -buildkite-plugin suffix
		{"https://github.com/my-org/buildkite-operator-buildkite-plugin.git#v1.0.0", true},
		{"https://github.com/my-org/buildkite-operator-buildkite-plugin#v1.0.0", true},
		{"https://git.example.com/ci/buildkite-operator.git#v1.0.0", true},
		{"https://git.example.com/ci/buildkite-operator", true},
		{"git@github.com:my-org/buildkite-operator-buildkite-plugin.git#v1.0.0", true},
		{"git@github.com:my-org/buildkite-operator.git", true},
		{"git@git.example.com:buildkite-operator.git#main", true},
		{"ssh://git@github.com/my-org/buildkite-operator-buildkite-plugin.git#v1", true},
		{"ssh://git@git.example.com:2222/ci/buildkite-operator#v1", true},
		{"file:///srv/plugins/buildkite-operator#v1", true},
		// local paths
		{"/srv/plugins/buildkite-operator", true},
		{"/srv/plugins/buildkite-operator/", true},
		{"/srv/plugins/buildkite-operator#v1.0.0", true},
		{"./buildkite-operator", true},
		{"./.buildkite/plugins/buildkite-operator#v1", true},
		{"../buildkite-operator-buildkite-plugin", true},
		// the agent names buildkite_operator the same way
		{"my-org/buildkite_operator#v1", true},
		// other plugins
		{"docker#v5.12.0", false},
		{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0", false},
		{"github.com/buildkite-plugins/kubernetes-buildkite-plugin", false},
		{"github.com/buildkite-operator/buildkite-operator/other#v1", false},
		{"/srv/buildkite-operator/plugins/docker", false},
		{"buildkite-operator-extra#v1", false},
		{"my-buildkite-operator#v1", false},
		{"", false},
		{"#buildkite-operator", false},
	} {
		t.Run(tc.source, func(t *testing.T) {
			assert.Equal(t, tc.want, IsOperatorSource(tc.source))
		})
	}
}

func TestFromJobSourceForms(t *testing.T) {
	cfg := map[string]any{"build_environment": "go-1-26", "log_paths": []string{"/workspace/a.log", "/workspace/b.log"}}
	want := Options{BuildEnvironment: "go-1-26", LogPaths: []string{"/workspace/a.log", "/workspace/b.log"}}
	for _, source := range []string{
		"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v1.0.0",
		"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin",
		"github.com/org/buildkite-operator-buildkite-plugin#v1.0.0",
		"https://github.com/org/buildkite-operator-buildkite-plugin.git#v1.0.0",
		"https://github.com/org/buildkite-operator-buildkite-plugin",
		"https://git.example.com/org/buildkite-operator.git#v1.0.0",
		"https://git.example.com/org/buildkite-operator",
		"git@github.com:org/buildkite-operator-buildkite-plugin.git#v1.0.0",
		"git@github.com:org/buildkite-operator.git",
		"ssh://git@github.com/org/buildkite-operator-buildkite-plugin.git#v1.0.0",
		"ssh://git@git.example.com/org/buildkite-operator",
		"/path/to/buildkite-operator",
		"/path/to/buildkite-operator#v1.0.0",
		"./buildkite-operator",
		"./.buildkite/plugins/buildkite-operator#main",
	} {
		t.Run(source, func(t *testing.T) {
			env := map[string]string{PluginsEnv: pluginsJSON(t,
				"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0", map[string]any{"image": "golang"},
				source, cfg)}
			got, err := FromJob(env)
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

func TestFromJob(t *testing.T) {
	const canonical = "github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0"
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Options
		wantErr []string // substrings of the error; nil means success
	}{
		{name: "no plugins and no env", env: map[string]string{}, want: Options{}},
		{name: "empty BUILDKITE_PLUGINS", env: map[string]string{PluginsEnv: ""}, want: Options{}},
		{name: "null BUILDKITE_PLUGINS", env: map[string]string{PluginsEnv: "null"}, want: Options{}},
		{name: "other plugins only", env: map[string]string{PluginsEnv: `[{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0":{"image":"x"}}]`}, want: Options{}},
		{name: "plugin with null config", env: map[string]string{PluginsEnv: `[{"` + canonical + `":null}]`}, want: Options{}},
		{name: "plugin as a plain string", env: map[string]string{PluginsEnv: `["` + canonical + `"]`}, want: Options{}},
		{
			name: "every option from the plugin",
			env: map[string]string{PluginsEnv: `[{"` + canonical + `":{"build_environment":"go-1-26","log_paths":["/workspace/a.log"],` +
				`"timeout_in_minutes":30,"resources":{"requests":{"cpu":"500m","memory":"1Gi","ephemeral-storage":2},"limits":{"cpu":2,"memory":"2Gi"}}}}]`},
			want: Options{
				BuildEnvironment: "go-1-26", LogPaths: []string{"/workspace/a.log"}, TimeoutMinutes: i32(30),
				Resources: &Resources{
					Requests: &ResourceList{CPU: "500m", Memory: "1Gi", EphemeralStorage: "2"},
					Limits:   &ResourceList{CPU: "2", Memory: "2Gi"},
				},
			},
		},
		{
			name: "every option from step env",
			env: map[string]string{
				"BK_OPERATOR_BUILD_ENVIRONMENT":                    "node-22",
				"BK_OPERATOR_LOG_PATHS":                            "/workspace/1.log; /workspace/2.log;",
				"BK_OPERATOR_TIMEOUT_IN_MINUTES":                   "45",
				"BK_OPERATOR_RESOURCES_REQUESTS_CPU":               "1",
				"BK_OPERATOR_RESOURCES_LIMITS_MEMORY":              "3Gi",
				"BK_OPERATOR_RESOURCES_REQUESTS_EPHEMERAL_STORAGE": "10Gi",
			},
			want: Options{
				BuildEnvironment: "node-22", LogPaths: []string{"/workspace/1.log", "/workspace/2.log"}, TimeoutMinutes: i32(45),
				Resources: &Resources{Requests: &ResourceList{CPU: "1", EphemeralStorage: "10Gi"}, Limits: &ResourceList{Memory: "3Gi"}},
			},
		},
		{
			name: "plugin wins field by field",
			env: map[string]string{
				PluginsEnv:                           `[{"` + canonical + `":{"log_paths":["/workspace/p.log"],"resources":{"requests":{"cpu":"2"}}}}]`,
				"BK_OPERATOR_BUILD_ENVIRONMENT":      "from-env",
				"BK_OPERATOR_LOG_PATHS":              "/workspace/e.log",
				"BK_OPERATOR_TIMEOUT_IN_MINUTES":     "10",
				"BK_OPERATOR_RESOURCES_REQUESTS_CPU": "1",
				"BK_OPERATOR_RESOURCES_LIMITS_CPU":   "4",
			},
			want: Options{
				BuildEnvironment: "from-env", LogPaths: []string{"/workspace/p.log"}, TimeoutMinutes: i32(10),
				Resources: &Resources{Requests: &ResourceList{CPU: "2"}, Limits: &ResourceList{CPU: "4"}},
			},
		},
		{name: "empty step env counts as unset", env: map[string]string{"BK_OPERATOR_BUILD_ENVIRONMENT": "", "BK_OPERATOR_LOG_PATHS": " "}, want: Options{}},
		{
			name:    "relative log path in the plugin",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"log_paths":["/workspace/a.log","logs/app.log"]}}]`},
			wantErr: []string{`plugin buildkite-operator: log_paths[1] "logs/app.log" is not an absolute path: give the full path inside the job's container, such as /workspace/logs/app.log`},
		},
		{
			name:    "relative log path in step env",
			env:     map[string]string{"BK_OPERATOR_LOG_PATHS": "/workspace/a.log;logs/app.log"},
			wantErr: []string{`step env BK_OPERATOR_LOG_PATHS entry 2 "logs/app.log" is not an absolute path`},
		},
		{
			name:    "dot-dot in a log path",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"log_paths":["/workspace/../etc/app.log"]}}]`},
			wantErr: []string{`log_paths[0] "/workspace/../etc/app.log" contains ".."`, "such as /etc/app.log"},
		},
		{
			name:    "empty and duplicate log paths",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"log_paths":["","/a.log","/a.log"]}}]`},
			wantErr: []string{"log_paths[0] is empty", `log_paths[2] "/a.log" repeats entry 2`},
		},
		{
			name:    "too many log paths",
			env:     map[string]string{"BK_OPERATOR_LOG_PATHS": "/1;/2;/3;/4;/5;/6;/7;/8;/9;/10;/11;/12;/13;/14;/15;/16;/17"},
			wantErr: []string{"step env BK_OPERATOR_LOG_PATHS lists 17 files, more than the 16 allowed"},
		},
		{
			name:    "log_paths given as a string",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"log_paths":"/workspace/a.log"}}]`},
			wantErr: []string{"plugin buildkite-operator: log_paths is a string, not a list of strings"},
		},
		{
			name:    "unknown option with a suggestion",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"log_path":["/a"],"colour":"blue"}}]`},
			wantErr: []string{`unknown option "log_path" (did you mean "log_paths"?)`, `unknown option "colour": the options are build_environment, log_paths, timeout_in_minutes, resources`},
		},
		{
			name:    "bad build environment name",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"build_environment":"Go 1.26"}}]`},
			wantErr: []string{`plugin buildkite-operator: build_environment "Go 1.26" is not a valid BuildEnvironment name`, "such as go-1-26", "in the operator's job namespace (buildkite-jobs by default)", "kubectl -n buildkite-jobs get buildenvironments"},
		},
		{
			name:    "empty build environment in the plugin",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"build_environment":""}}]`},
			wantErr: nil, // "" means the operator's default, as if unset
		},
		{
			name:    "build_environment not a string",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"build_environment":7}}]`},
			wantErr: []string{"build_environment is a number (7), not a string"},
		},
		{
			name:    "timeout out of range",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"timeout_in_minutes":0}}]`},
			wantErr: []string{"plugin buildkite-operator: timeout_in_minutes 0 is out of range: give a whole number of minutes from 1 to 10080"},
		},
		{
			name:    "huge timeout",
			env:     map[string]string{"BK_OPERATOR_TIMEOUT_IN_MINUTES": "99999999999"},
			wantErr: []string{"step env BK_OPERATOR_TIMEOUT_IN_MINUTES 99999999999 is out of range"},
		},
		{
			name:    "quoted timeout",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"timeout_in_minutes":"30"}}]`},
			wantErr: []string{"timeout_in_minutes is a string, not a whole number of minutes"},
		},
		{
			name:    "timeout not a number in step env",
			env:     map[string]string{"BK_OPERATOR_TIMEOUT_IN_MINUTES": "1h"},
			wantErr: []string{`step env BK_OPERATOR_TIMEOUT_IN_MINUTES="1h" is not a whole number of minutes`},
		},
		{
			name:    "bad quantity",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"resources":{"limits":{"memory":"4 GB"}}}}]`},
			wantErr: []string{`plugin buildkite-operator: resources.limits.memory "4 GB" is not a Kubernetes quantity`, "such as 512Mi or 4Gi"},
		},
		{
			name:    "negative quantity",
			env:     map[string]string{"BK_OPERATOR_RESOURCES_REQUESTS_CPU": "-1"},
			wantErr: []string{`step env BK_OPERATOR_RESOURCES_REQUESTS_CPU "-1" is negative`},
		},
		{
			name:    "unknown resource",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"resources":{"requests":{"gpu":1},"limts":{}}}}]`},
			wantErr: []string{`unknown resource "resources.requests.gpu"`, `unknown option "resources.limts" (did you mean "limits"?)`},
		},
		{
			name:    "request above limit in the plugin",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":{"resources":{"requests":{"memory":"8Gi"},"limits":{"memory":"4Gi"}}}}]`},
			wantErr: []string{"plugin buildkite-operator: resources.requests.memory 8Gi is more than its limit 4Gi (resources.limits.memory)"},
		},
		{
			name: "request from the plugin above limit from step env",
			env: map[string]string{
				PluginsEnv:                         `[{"` + canonical + `":{"resources":{"requests":{"cpu":"3"}}}}]`,
				"BK_OPERATOR_RESOURCES_LIMITS_CPU": "2",
			},
			wantErr: []string{"plugin buildkite-operator: resources.requests.cpu 3 is more than its limit 2 (step env BK_OPERATOR_RESOURCES_LIMITS_CPU)"},
		},
		{
			name:    "unknown step env option",
			env:     map[string]string{"BK_OPERATOR_LOG_PATH": "/a.log"},
			wantErr: []string{"step env BK_OPERATOR_LOG_PATH is not an option of buildkite-operator (did you mean \"BK_OPERATOR_LOG_PATHS\"?)"},
		},
		{
			name:    "plugin listed twice",
			env:     map[string]string{PluginsEnv: `[{"buildkite-operator#v1":{}},{"` + canonical + `":{}}]`},
			wantErr: []string{"the step lists the plugin 2 times"},
		},
		{
			name:    "config not a map",
			env:     map[string]string{PluginsEnv: `[{"` + canonical + `":["/a.log"]}]`},
			wantErr: []string{"the plugin's config is a list, not a map of options"},
		},
		{
			name:    "BUILDKITE_PLUGINS not JSON",
			env:     map[string]string{PluginsEnv: `buildkite-operator#v1`},
			wantErr: []string{"BUILDKITE_PLUGINS is not a JSON array of plugins"},
		},
		{
			name:    "BUILDKITE_PLUGINS element of the wrong kind",
			env:     map[string]string{PluginsEnv: `[42]`},
			wantErr: []string{"BUILDKITE_PLUGINS[0] is a number (42), not a plugin"},
		},
		{
			name: "errors from both sources are all reported",
			env: map[string]string{
				PluginsEnv:                       `[{"` + canonical + `":{"log_paths":["rel.log"]}}]`,
				"BK_OPERATOR_TIMEOUT_IN_MINUTES": "-5",
			},
			wantErr: []string{`log_paths[0] "rel.log" is not an absolute path`, "step env BK_OPERATOR_TIMEOUT_IN_MINUTES -5 is out of range"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromJob(tc.env)
			if tc.wantErr == nil {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				assert.NoError(t, got.Validate(), "FromJob's result must pass Validate")
				return
			}
			require.Error(t, err)
			for _, want := range tc.wantErr {
				assert.Contains(t, err.Error(), want)
			}
			assert.Equal(t, Options{}, got, "options are zero on error")
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "zero", opts: Options{}},
		{name: "all set", opts: Options{BuildEnvironment: "a.b-c", LogPaths: []string{"/", "/x/./y", "/x/..y"}, TimeoutMinutes: i32(MaxTimeoutMinutes),
			Resources: &Resources{Requests: &ResourceList{CPU: "0"}, Limits: &ResourceList{CPU: "100m"}}}},
		{name: "name too long", opts: Options{BuildEnvironment: string(make([]byte, 254))}, wantErr: "is not a valid BuildEnvironment name"},
		{name: "control character", opts: Options{LogPaths: []string{"/a\nb"}}, wantErr: `log_paths[0] "/a\nb" contains a NUL or line break`},
		{name: "timeout above max", opts: Options{TimeoutMinutes: i32(MaxTimeoutMinutes + 1)}, wantErr: "timeout_in_minutes 10081 is out of range"},
		{name: "ephemeral storage", opts: Options{Resources: &Resources{Limits: &ResourceList{EphemeralStorage: "lots"}}}, wantErr: `resources.limits.ephemeral-storage "lots" is not a Kubernetes quantity`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestRequirements(t *testing.T) {
	got, err := (&Resources{Requests: &ResourceList{CPU: "500m", EphemeralStorage: "1Gi"}, Limits: &ResourceList{Memory: "2Gi"}}).Requirements()
	require.NoError(t, err)
	assert.Equal(t, &corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceEphemeralStorage: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")},
	}, got)

	none, err := (*Resources)(nil).Requirements()
	require.NoError(t, err)
	assert.Nil(t, none)

	_, err = (&Resources{Limits: &ResourceList{CPU: "x"}}).Requirements()
	require.ErrorContains(t, err, `resources.limits.cpu "x"`)
}

func TestStripOperatorPlugin(t *testing.T) {
	const docker = `{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0":{"image":"golang","env":["A=1"]}}`
	for _, tc := range []struct {
		name, in, want, wantErr string
	}{
		{name: "empty", in: "", want: ""},
		{name: "only the operator", in: `[{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0":{"build_environment":"go"}}]`, want: ""},
		{name: "operator as a string", in: `["buildkite-operator#v0.1.0"]`, want: ""},
		{name: "keeps others verbatim and in order", in: `[` + docker + `, {"/src/buildkite-operator":null}, "github.com/org/cache-buildkite-plugin#v1"]`,
			want: `[` + docker + `,"github.com/org/cache-buildkite-plugin#v1"]`},
		{name: "no operator", in: `[` + docker + `]`, want: `[` + docker + `]`},
		{name: "object naming several plugins", in: `[{"buildkite-operator#v1":{},"docker#v5":null}]`, want: `[{"docker#v5":null}]`},
		{name: "empty list", in: `[]`, want: ""},
		{name: "not JSON", in: `{`, wantErr: "BUILDKITE_PLUGINS is not a JSON array of plugins"},
		{name: "not an array", in: `{"a":1}`, wantErr: "BUILDKITE_PLUGINS is not a JSON array of plugins"},
		{name: "bad element", in: `[true]`, wantErr: "BUILDKITE_PLUGINS[0] is a boolean (true), not a plugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StripOperatorPlugin(tc.in)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// The JSON form of Options is the plugin's config: a config encoded from
// Options and put back into BUILDKITE_PLUGINS reads back unchanged.
func TestOptionsRoundTrip(t *testing.T) {
	opts := Options{BuildEnvironment: "go", LogPaths: []string{"/workspace/x.log"}, TimeoutMinutes: i32(5),
		Resources: &Resources{Requests: &ResourceList{Memory: "1Gi"}}}
	cfg, err := json.Marshal(opts)
	require.NoError(t, err)
	got, err := FromJob(map[string]string{PluginsEnv: fmt.Sprintf(`[{"buildkite-operator#v0.1.0":%s}]`, cfg)})
	require.NoError(t, err)
	assert.Equal(t, opts, got)
}
