package plugin_test

import (
	"maps"
	"slices"

	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/pkg/plugin"
)

// pluginYAMLPath is plugin.yml at the repository root, where Buildkite looks for it.
const pluginYAMLPath = "../plugin.yml"

// pluginYAMLRules are the rules the Buildkite plugin linter checks plugin.yml
// against (buildkite-plugin-linter, plugin-yaml-linter), written out here so the
// test needs no network.
const pluginYAMLRules = `{
  "type": "object",
  "required": ["name", "description", "author", "requirements", "configuration"],
  "properties": {
    "name": {"type": "string", "minLength": 1},
    "description": {"type": "string", "minLength": 1},
    "author": {"type": "string", "pattern": "^https?://"},
    "requirements": {"type": "array", "items": {"type": "string"}},
    "configuration": {
      "type": "object",
      "required": ["properties"],
      "properties": {
        "properties": {"type": "object"},
        "required": {"type": "array", "items": {"type": "string"}},
        "additionalProperties": {"type": "boolean"}
      }
    }
  }
}`

// toJSONValue converts YAML (or JSON) to the value form jsonschema validates.
func toJSONValue(t *testing.T, doc []byte) any {
	t.Helper()
	j, err := yaml.YAMLToJSON(doc)
	require.NoError(t, err)
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
	require.NoError(t, err)
	return v
}

func compileSchema(t *testing.T, url string, doc any) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	// The linter's Ajv defaults to draft-07; the agent's validator reads the same keywords.
	c.DefaultDraft(jsonschema.Draft7)
	require.NoError(t, c.AddResource(url, doc))
	sch, err := c.Compile(url)
	require.NoError(t, err, "%s must compile as a JSON schema", url)
	return sch
}

// pluginYAML returns plugin.yml as a JSON value.
func pluginYAML(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(pluginYAMLPath)
	require.NoError(t, err)
	v, ok := toJSONValue(t, b).(map[string]any)
	require.True(t, ok, "plugin.yml must be a map")
	return v
}

// configSchema compiles plugin.yml's configuration, as the linter and the agent do.
func configSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	return compileSchema(t, "file:///plugin.yml/configuration", pluginYAML(t)["configuration"])
}

func TestPluginYAMLPassesTheLinterRules(t *testing.T) {
	doc := pluginYAML(t)
	rules := compileSchema(t, "file:///plugin-yaml-rules.json", toJSONValue(t, []byte(pluginYAMLRules)))
	require.NoError(t, rules.Validate(doc))
	configSchema(t)

	cfg := doc["configuration"].(map[string]any)
	assert.Equal(t, false, cfg["additionalProperties"], "configuration.additionalProperties must be false so that typos are caught")
}

// schemaNode resolves a "#/..." $ref within the configuration schema.
func schemaNode(t *testing.T, root, node map[string]any) map[string]any {
	t.Helper()
	ref, ok := node["$ref"].(string)
	if !ok {
		return node
	}
	require.True(t, strings.HasPrefix(ref, "#/"), "only local $refs are used: %s", ref)
	var cur any = root
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, ok := cur.(map[string]any)
		require.True(t, ok, "$ref %s does not resolve", ref)
		cur = m[part]
	}
	m, ok := cur.(map[string]any)
	require.True(t, ok, "$ref %s does not resolve to a schema", ref)
	return schemaNode(t, root, m)
}

// schemaTypes returns the JSON types a schema node allows, looking through anyOf.
func schemaTypes(t *testing.T, root, node map[string]any) []string {
	t.Helper()
	node = schemaNode(t, root, node)
	var out []string
	switch ty := node["type"].(type) {
	case string:
		out = append(out, ty)
	case []any:
		for _, x := range ty {
			out = append(out, x.(string))
		}
	}
	if anyOf, ok := node["anyOf"].([]any); ok {
		for _, alt := range anyOf {
			out = append(out, schemaTypes(t, root, alt.(map[string]any))...)
		}
	}
	sort.Strings(out)
	return out
}

var quantityType = reflect.TypeFor[plugin.Quantity]()

// goTypes is the JSON types a Go field's value takes.
func goTypes(ty reflect.Type) []string {
	if ty.Kind() == reflect.Pointer {
		ty = ty.Elem()
	}
	switch {
	case ty == quantityType:
		return []string{"number", "string"} // see Quantity.UnmarshalJSON
	case ty.Kind() == reflect.String:
		return []string{"string"}
	case ty.Kind() == reflect.Slice:
		return []string{"array"}
	case ty.Kind() >= reflect.Int && ty.Kind() <= reflect.Uint64:
		return []string{"integer"}
	case ty.Kind() == reflect.Struct:
		return []string{"object"}
	}
	panic(fmt.Sprintf("goTypes: add a JSON type for %s", ty))
}

// agree walks a Go struct and its schema node together.
func agree(t *testing.T, root, node map[string]any, ty reflect.Type, at string) {
	t.Helper()
	if ty.Kind() == reflect.Pointer {
		ty = ty.Elem()
	}
	node = schemaNode(t, root, node)
	assert.Equal(t, false, node["additionalProperties"], "%s: objects must set additionalProperties: false", at)

	props, _ := node["properties"].(map[string]any)
	goFields := map[string]reflect.StructField{}
	var goRequired []string
	for i := range ty.NumField() {
		f := ty.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		require.NotEmpty(t, name, "%s.%s needs a json tag", at, f.Name)
		goFields[name] = f
		if !strings.Contains(opts, "omitempty") {
			goRequired = append(goRequired, name)
		}
	}
	assert.ElementsMatch(t, slices.Sorted(maps.Keys(goFields)), slices.Sorted(maps.Keys(props)), "%s: plugin.yml properties and Go json fields differ", at)

	var schemaRequired []string
	if req, ok := node["required"].([]any); ok {
		for _, r := range req {
			schemaRequired = append(schemaRequired, r.(string))
		}
	}
	assert.ElementsMatch(t, goRequired, schemaRequired, "%s: required options differ (a Go field without omitempty is required)", at)

	for name, f := range goFields {
		p, ok := props[name].(map[string]any)
		if !ok {
			continue // reported above
		}
		path := at + "." + name
		assert.Equal(t, goTypes(f.Type), schemaTypes(t, root, p), "%s: JSON types differ", path)
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Slice:
			items, ok := schemaNode(t, root, p)["items"].(map[string]any)
			require.True(t, ok, "%s: arrays must describe their items", path)
			assert.Equal(t, goTypes(ft.Elem()), schemaTypes(t, root, items), "%s[]: JSON types differ", path)
		case ft.Kind() == reflect.Struct:
			agree(t, root, p, ft, path)
		}
	}
}

func TestSchemaMatchesOptions(t *testing.T) {
	cfg := pluginYAML(t)["configuration"].(map[string]any)
	agree(t, cfg, cfg, reflect.TypeFor[plugin.Options](), "configuration")

	// The Go limits and the schema's.
	props := cfg["properties"].(map[string]any)
	assert.EqualValues(t, json.Number(fmt.Sprint(plugin.MaxLogPaths)), props["log_paths"].(map[string]any)["maxItems"])
	assert.EqualValues(t, json.Number("1"), props["timeout_in_minutes"].(map[string]any)["minimum"])
	assert.EqualValues(t, json.Number(fmt.Sprint(plugin.MaxTimeoutMinutes)), props["timeout_in_minutes"].(map[string]any)["maximum"])
}

// Whatever the schema can express, the schema and FromJob decide alike: a step
// the linter passes is not rejected by the operator, and the other way round.
func TestSchemaAndGoAgreeOnConfigs(t *testing.T) {
	sch := configSchema(t)
	for _, tc := range []struct {
		config string
		valid  bool
	}{
		{`{}`, true},
		{`{"build_environment":"go-1-26"}`, true},
		{`{"build_environment":"a.b.c"}`, true},
		{`{"build_environment":"Go"}`, false},
		{`{"build_environment":"-go"}`, false},
		{`{"build_environment":"go_1"}`, false},
		{`{"build_environment":7}`, false},
		{`{"log_paths":[]}`, true},
		{`{"log_paths":["/workspace/a.log","/var/log/x/.hidden","/a/..b/c","/a/b..","/a/./b","/"]}`, true},
		{`{"log_paths":["relative.log"]}`, false},
		{`{"log_paths":["./a.log"]}`, false},
		{`{"log_paths":["/workspace/../etc/passwd"]}`, false},
		{`{"log_paths":["/a/.."]}`, false},
		{`{"log_paths":["/a","/a"]}`, false},
		{`{"log_paths":"/a"}`, false},
		{`{"log_paths":[1]}`, false},
		{`{"log_paths":["/1","/2","/3","/4","/5","/6","/7","/8","/9","/10","/11","/12","/13","/14","/15","/16"]}`, true},
		{`{"log_paths":["/1","/2","/3","/4","/5","/6","/7","/8","/9","/10","/11","/12","/13","/14","/15","/16","/17"]}`, false},
		{`{"timeout_in_minutes":1}`, true},
		{`{"timeout_in_minutes":10080}`, true},
		{`{"timeout_in_minutes":0}`, false},
		{`{"timeout_in_minutes":10081}`, false},
		{`{"timeout_in_minutes":"30"}`, false},
		{`{"timeout_in_minutes":1.5}`, false},
		{`{"resources":{}}`, true},
		{`{"resources":{"requests":{"cpu":"500m","memory":"1Gi","ephemeral-storage":"10G"},"limits":{"cpu":2,"memory":"1.5Gi"}}}`, true},
		{`{"resources":{"requests":{"cpu":0.5,"memory":"1e9"}}}`, true},
		{`{"resources":{"requests":{"cpu":".5"}}}`, true},
		{`{"resources":{"requests":{"cpu":"-1"}}}`, false},
		{`{"resources":{"requests":{"cpu":-1}}}`, false},
		{`{"resources":{"requests":{"memory":"4 GB"}}}`, false},
		{`{"resources":{"requests":{"memory":"4GB"}}}`, false},
		{`{"resources":{"requests":{"memory":"4gi"}}}`, false},
		{`{"resources":{"requests":{"memory":true}}}`, false},
		{`{"resources":{"requests":{"gpu":"1"}}}`, false},
		{`{"resources":{"requets":{}}}`, false},
		{`{"resources":[]}`, false},
		{`{"colour":"blue"}`, false},
	} {
		t.Run(tc.config, func(t *testing.T) {
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(tc.config))
			require.NoError(t, err)
			schemaErr := sch.Validate(v)
			_, goErr := plugin.FromJob(map[string]string{plugin.PluginsEnv: `[{"buildkite-operator#v0.1.0":` + tc.config + `}]`})
			assert.Equal(t, tc.valid, schemaErr == nil, "plugin.yml schema: %v", schemaErr)
			assert.Equal(t, tc.valid, goErr == nil, "FromJob: %v", goErr)
		})
	}
}
