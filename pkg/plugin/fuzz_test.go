package plugin

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzFromJob: whatever the job env holds, FromJob never panics, every
// rejection says why, and whatever it accepts passes Validate.
// Seeds are in testdata/fuzz/FuzzFromJob.
func FuzzFromJob(f *testing.F) {
	f.Add(`[{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0":{"build_environment":"go","log_paths":["/a"]}}]`, "", "", "", "")
	f.Add("", "go-1-26", "/workspace/a.log;/workspace/b.log", "30", "500m")
	f.Fuzz(func(t *testing.T, plugins, buildEnv, logPaths, timeout, cpu string) {
		env := map[string]string{
			PluginsEnv:                           plugins,
			"BK_OPERATOR_BUILD_ENVIRONMENT":      buildEnv,
			"BK_OPERATOR_LOG_PATHS":              logPaths,
			"BK_OPERATOR_TIMEOUT_IN_MINUTES":     timeout,
			"BK_OPERATOR_RESOURCES_REQUESTS_CPU": cpu,
		}
		got, err := FromJob(env)
		again, err2 := FromJob(env)
		require.Equal(t, err == nil, err2 == nil, "FromJob must be deterministic")
		if err != nil {
			require.NotEmpty(t, err.Error(), "a rejection must say what is wrong")
			require.Equal(t, err.Error(), err2.Error(), "errors must be deterministic")
			require.Equal(t, Options{}, got)
			return
		}
		require.Equal(t, got, again)
		require.NoError(t, got.Validate(), "accepted options must pass Validate")
		_, err = got.Resources.Requirements()
		require.NoError(t, err, "accepted resources must convert to Kubernetes quantities")
	})
}

// FuzzStripOperatorPlugin: never panics, rejections say why, and what it
// returns is a plugin list without the operator that strips to itself.
// Seeds are in testdata/fuzz/FuzzStripOperatorPlugin.
func FuzzStripOperatorPlugin(f *testing.F) {
	f.Add(`[{"github.com/buildkite-plugins/buildkite-operator-buildkite-plugin#v0.1.0":null},"docker#v5"]`)
	f.Fuzz(func(t *testing.T, in string) {
		out, err := StripOperatorPlugin(in)
		entries, _, perr := parsePlugins(in)
		if err != nil {
			require.NotEmpty(t, err.Error(), "a rejection must say what is wrong")
			require.Error(t, perr, "Strip rejects only what FromJob's parser rejects")
			return
		}
		require.NoError(t, perr)
		others := 0
		for _, el := range entries {
			for _, e := range el {
				if !IsOperatorSource(e.source) {
					others++
				}
			}
		}
		if out == "" {
			assert.Zero(t, others, "Strip returned nothing but other plugins were listed")
			return
		}
		require.True(t, json.Valid([]byte(out)), "output %q is not JSON", out)
		outEntries, _, err := parsePlugins(out)
		require.NoError(t, err)
		kept := 0
		for _, el := range outEntries {
			for _, e := range el {
				require.False(t, IsOperatorSource(e.source), "output still names the operator: %s", out)
				kept++
			}
		}
		require.Equal(t, others, kept, "every other plugin must be kept")
		again, err := StripOperatorPlugin(out)
		require.NoError(t, err)
		require.Equal(t, out, again, "stripping must be idempotent")
	})
}
