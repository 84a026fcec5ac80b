package plugin_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
)

// yamlFence finds ```yaml and ```yml blocks in Markdown, as the plugin linter's example check does.
var yamlFence = regexp.MustCompile("(?ms)^```ya?ml[ \t]*\n(.*?)^```")

// versioned is the #version the linter requires on every example.
var versioned = regexp.MustCompile(`#v?\d+\.\d+\.\d+$`)

type pluginExample struct {
	where  string
	source string
	config any
}

// examplesIn returns the operator plugin entries of a pipeline document: under
// steps: or a bare list, groups flattened, only the list form of plugins:.
func examplesIn(t *testing.T, where string, doc []byte) []pluginExample {
	t.Helper()
	var v any
	require.NoError(t, yaml.Unmarshal(doc, &v), "%s is not valid YAML", where)
	var steps []any
	switch d := v.(type) {
	case map[string]any:
		steps, _ = d["steps"].([]any)
	case []any:
		steps = d
	}
	var out []pluginExample
	var walk func(steps []any)
	walk = func(steps []any) {
		for _, s := range steps {
			step, ok := s.(map[string]any)
			if !ok {
				continue
			}
			if inner, ok := step["steps"].([]any); ok {
				walk(inner)
			}
			plugins, _ := step["plugins"].([]any)
			for _, p := range plugins {
				switch p := p.(type) {
				case string:
					if plugin.IsOperatorSource(p) {
						out = append(out, pluginExample{where, p, nil})
					}
				case map[string]any:
					for source, cfg := range p {
						if plugin.IsOperatorSource(source) {
							out = append(out, pluginExample{where, source, cfg})
						}
					}
				}
			}
		}
	}
	walk(steps)
	return out
}

// exampleProblems validates an example as the linter does (version present,
// config valid against plugin.yml) and as the operator does (plugin.FromJob accepts it).
func exampleProblems(sch *jsonschema.Schema, ex pluginExample) []string {
	var problems []string
	if !versioned.MatchString(ex.source) {
		problems = append(problems, fmt.Sprintf("%s: %s must carry a #vX.Y.Z version", ex.where, ex.source))
	}
	cfg := ex.config
	if cfg == nil {
		cfg = map[string]any{}
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return append(problems, fmt.Sprintf("%s: %v", ex.where, err))
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(string(b)))
	if err == nil {
		err = sch.Validate(v)
	}
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s: %s: config %s does not match plugin.yml: %v", ex.where, ex.source, b, err))
	}
	plugins, err := json.Marshal([]map[string]any{{ex.source: ex.config}})
	if err == nil {
		_, err = plugin.FromJob(map[string]string{plugin.PluginsEnv: string(plugins)})
	}
	if err != nil {
		problems = append(problems, fmt.Sprintf("%s: the operator rejects the example %s: %v", ex.where, b, err))
	}
	return problems
}

func checkExamples(t *testing.T, sch *jsonschema.Schema, examples []pluginExample) {
	t.Helper()
	for _, ex := range examples {
		assert.Empty(t, exampleProblems(sch, ex))
	}
}

func TestReadmeExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	sch := configSchema(t)
	var examples []pluginExample
	blocks := yamlFence.FindAllSubmatch(readme, -1)
	require.NotEmpty(t, blocks, "README.md has no ```yaml examples")
	for i, block := range blocks {
		examples = append(examples, examplesIn(t, "README.md yaml block "+string(rune('1'+i)), block[1])...)
	}
	require.GreaterOrEqual(t, len(examples), 4, "README.md must show the plugin in use (the linter needs at least one example)")
	checkExamples(t, sch, examples)
}

func TestExamplePipelines(t *testing.T) {
	files, err := filepath.Glob("examples/*.yml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	sch := configSchema(t)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		examples := examplesIn(t, f, b)
		require.NotEmpty(t, examples, "%s does not use the plugin", f)
		checkExamples(t, sch, examples)
	}
}

// TestReadmeDescribesEveryOption: every option plugin.yml knows, at every level,
// and every step env variable, is named in the README.
func TestReadmeDescribesEveryOption(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	cfg := pluginYAML(t)["configuration"].(map[string]any)
	var names []string
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		props, _ := node["properties"].(map[string]any)
		for name, p := range props {
			names = append(names, name)
			if m, ok := p.(map[string]any); ok {
				walk(m)
			}
		}
	}
	walk(cfg)
	require.Len(t, names, 4+2+3*2, "option names found in plugin.yml")
	for _, name := range names {
		assert.Contains(t, string(readme), "`"+name+"`", "README.md does not describe the option %s", name)
	}
	for _, env := range []string{"BK_OPERATOR_BUILD_ENVIRONMENT", "BK_OPERATOR_LOG_PATHS", "BK_OPERATOR_TIMEOUT_IN_MINUTES", "BK_OPERATOR_RESOURCES_REQUESTS_CPU", plugin.OperatorJobEnv} {
		assert.Contains(t, string(readme), "`"+env+"`", "README.md does not mention %s", env)
	}
}

// The example checker must reject what the linter rejects, or the checks above prove nothing.
func TestExampleCheckerRejectsBadExamples(t *testing.T) {
	sch := configSchema(t)
	for _, tc := range []struct{ name, doc string }{
		{"no version", "steps:\n  - command: x\n    plugins:\n      - buildkite-operator:\n          build_environment: go\n"},
		{"unknown option", "steps:\n  - command: x\n    plugins:\n      - buildkite-operator#v0.1.0:\n          colour: blue\n"},
		{"relative log path in a group", "- group: g\n  steps:\n    - command: x\n      plugins:\n        - buildkite-operator#v0.1.0:\n            log_paths: [a.log]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			examples := examplesIn(t, tc.name, []byte(tc.doc))
			require.Len(t, examples, 1)
			assert.NotEmpty(t, exampleProblems(sch, examples[0]), "the example must be rejected")
		})
	}
}
