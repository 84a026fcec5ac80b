package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// nonIDCharacter is what the agent replaces with "-" when it turns a plugin's
// location into its name (agent/plugin/plugin.go Name).
var nonIDCharacter = regexp.MustCompile(`[^a-zA-Z0-9]`)

// IsOperatorSource reports whether a plugin source, in any form a pipeline or
// the Buildkite backend writes it, names this plugin:
//
//	buildkite-operator#v0.1.0
//	github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0
//	my-org/buildkite-operator, github.com/my-org/buildkite-operator-buildkite-plugin#v1
//	https://git.example.com/ci/buildkite-operator.git#v1, git@host:ci/buildkite-operator.git
//	/srv/plugins/buildkite-operator, ./.buildkite/plugins/buildkite-operator
//
// It names the plugin the way the agent does (the last path segment, lowercased,
// other characters turned into "-", "-buildkite-plugin" dropped), so that it
// matches exactly the entries whose hooks see BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_*.
// Forks and private copies under another organisation or host match too.
func IsOperatorSource(source string) bool {
	name := agentPluginName(source)
	// A .git URL without the -buildkite-plugin suffix keeps "-git" in the agent's
	// name (its env prefix becomes BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_GIT_).
	return name == Name || name == Name+"-git"
}

func agentPluginName(source string) string {
	loc, _, _ := strings.Cut(source, "#")
	loc = strings.ReplaceAll(loc, `\`, "/")
	loc = strings.TrimRight(loc, "/")
	// scp-like git sources (git@host:repo.git) have no "/" before the name.
	if i := strings.LastIndexAny(loc, "/:"); i >= 0 {
		loc = loc[i+1:]
	}
	name := nonIDCharacter.ReplaceAllString(strings.ToLower(loc), "-")
	name = strings.ReplaceAll(name, "-buildkite-plugin-git", "")
	return strings.ReplaceAll(name, "-buildkite-plugin", "")
}

// pluginEntry is one plugin of BUILDKITE_PLUGINS.
type pluginEntry struct {
	source string
	config json.RawMessage // nil when the plugin has no config
}

// parsePlugins reads BUILDKITE_PLUGINS: a JSON array whose elements are either a
// plugin source string or an object {source: config-or-null}, as the agent
// accepts (agent/plugin/plugin.go CreateFromJSON). It returns the elements as
// raw JSON too, so that StripOperatorPlugin can keep the others byte for byte.
func parsePlugins(pluginsJSON string) (entries [][]pluginEntry, raw []json.RawMessage, err error) {
	if strings.TrimSpace(pluginsJSON) == "" {
		return nil, nil, nil
	}
	if err := json.Unmarshal([]byte(pluginsJSON), &raw); err != nil {
		return nil, nil, fmt.Errorf("%s is not a JSON array of plugins (%v): it should look like "+
			`[{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0":{"build_environment":"go"}}]`, PluginsEnv, err)
	}
	entries = make([][]pluginEntry, len(raw))
	for i, el := range raw {
		el = bytes.TrimSpace(el)
		switch {
		case len(el) > 0 && el[0] == '"':
			var source string
			if err := json.Unmarshal(el, &source); err != nil {
				return nil, nil, fmt.Errorf("%s[%d]: %w", PluginsEnv, i, err)
			}
			entries[i] = []pluginEntry{{source: source}}
		case len(el) > 0 && el[0] == '{':
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(el, &obj); err != nil {
				return nil, nil, fmt.Errorf("%s[%d]: %w", PluginsEnv, i, err)
			}
			for _, source := range sortedKeys(obj) {
				cfg := bytes.TrimSpace(obj[source])
				if bytes.Equal(cfg, []byte("null")) {
					cfg = nil
				}
				entries[i] = append(entries[i], pluginEntry{source: source, config: cfg})
			}
		default:
			return nil, nil, fmt.Errorf("%s[%d] is %s, not a plugin: each element must be a plugin source string "+
				"or an object mapping one plugin source to its config", PluginsEnv, i, describeJSON(el))
		}
	}
	return entries, raw, nil
}

// StripOperatorPlugin returns BUILDKITE_PLUGINS without the operator's own
// entries, so that a `buildkite-agent bootstrap` inside the job's pod does not
// try to fetch and run this plugin. The other plugins are kept as they were,
// byte for byte and in order. When no plugin is left it returns "": the
// bootstrap skips its plugin phases entirely for an empty BUILDKITE_PLUGINS.
func StripOperatorPlugin(pluginsJSON string) (string, error) {
	entries, raw, err := parsePlugins(pluginsJSON)
	if err != nil {
		return "", err
	}
	kept := make([][]byte, 0, len(raw))
	for i, el := range raw {
		operator := 0
		for _, e := range entries[i] {
			if IsOperatorSource(e.source) {
				operator++
			}
		}
		switch {
		case operator == 0:
			kept = append(kept, bytes.TrimSpace(el))
		case operator == len(entries[i]):
			// the whole element is the operator's: drop it
		default:
			// An object naming several plugins (the agent accepts it): keep the others.
			rest := map[string]json.RawMessage{}
			for _, e := range entries[i] {
				if !IsOperatorSource(e.source) {
					if e.config == nil {
						rest[e.source] = json.RawMessage("null")
					} else {
						rest[e.source] = e.config
					}
				}
			}
			b, err := json.Marshal(rest)
			if err != nil {
				return "", fmt.Errorf("%s[%d]: re-encoding the other plugins: %w", PluginsEnv, i, err)
			}
			kept = append(kept, b)
		}
	}
	if len(kept) == 0 {
		return "", nil
	}
	return "[" + string(bytes.Join(kept, []byte(","))) + "]", nil
}

// describeJSON names the kind of a JSON value for error messages.
func describeJSON(v []byte) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return "empty"
	}
	switch v[0] {
	case '"':
		return "a string"
	case '[':
		return "a list"
	case '{':
		return "an object"
	case 't', 'f':
		return "a boolean (" + string(v) + ")"
	case 'n':
		return "null"
	default:
		return "a number (" + string(v) + ")"
	}
}
