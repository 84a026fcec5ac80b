// Package plugin is the one definition of the options a pipeline step gives the
// buildkite-operator plugin: their Go types, how they are read from a job's env
// (the plugin's entry in BUILDKITE_PLUGINS, or BK_OPERATOR_* step env as a
// fallback) and how they are checked. The JobSpawner reads jobs with it; plugin.yml
// and hooks/environment at the repository root describe the same options for
// Buildkite, and the tests in plugin/ (package plugin_test, beside the plugin's README,
// examples and bats tests) keep all three in agreement.
package plugin

import (
	"encoding/json"
	"fmt"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Name is the plugin's name: the last segment of its repository, this one, which pipelines
// refer to as https://github.com/buildkite-operator/buildkite-operator.git#vX.Y.Z, at the tag
// of the operator release they run on (IsOperatorSource recognises every form).
const Name = "buildkite-operator"

// EnvPrefix is the prefix of the variables through which the agent hands the
// plugin's options to its hooks (BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_LOG_PATHS_0=...).
const EnvPrefix = "BUILDKITE_PLUGIN_BUILDKITE_OPERATOR_"

// StepEnvPrefix is the prefix of the step env variables that give options when a
// step does not use the plugin (BK_OPERATOR_BUILD_ENVIRONMENT, BK_OPERATOR_LOG_PATHS, ...).
const StepEnvPrefix = "BK_OPERATOR_"

// OperatorJobEnv is set, to the BuildJob's "namespace/name", in every container
// of every job pod the operator runs. The plugin's environment hook fails when it
// is missing, because then an ordinary agent, not the operator, picked up the step.
const OperatorJobEnv = podcontract.EnvPodMarker

// PluginsEnv is the job env variable holding the step's plugins as JSON.
const PluginsEnv = "BUILDKITE_PLUGINS"

// Limits shared with the BuildJob API (pkg/apis/v1alpha1), so that options this
// package accepts are never rejected when the BuildJob is created.
const (
	MaxLogPaths       = 16
	MaxTimeoutMinutes = 7 * 24 * 60
)

// Options a step chooses for its job, from the plugin's config or, as a fallback, step env.
// Every field is optional: an unset field means "the BuildEnvironment's default".
type Options struct {
	// BuildEnvironment names the BuildEnvironment, in the operator's job namespace, the
	// job runs in; empty means the operator's default.
	BuildEnvironment string `json:"build_environment,omitempty"`
	// LogPaths are absolute paths of files inside the job's container whose
	// content is streamed into the job's Buildkite log as they grow.
	LogPaths []string `json:"log_paths,omitempty"`
	// TimeoutMinutes bounds how long the job may run, within the
	// BuildEnvironment's maximum.
	TimeoutMinutes *int32 `json:"timeout_in_minutes,omitempty"`
	// Resources of the job's command container, within the BuildEnvironment's
	// maxResources.
	Resources *Resources `json:"resources,omitempty"`
}

// Resources are the requests and limits of the job's command container.
type Resources struct {
	Requests *ResourceList `json:"requests,omitempty"`
	Limits   *ResourceList `json:"limits,omitempty"`
}

// ResourceList holds the resources a step may size, as Kubernetes quantities.
// The field names are the Kubernetes resource names, so pod specs copy across.
type ResourceList struct {
	CPU              Quantity `json:"cpu,omitempty"`
	Memory           Quantity `json:"memory,omitempty"`
	EphemeralStorage Quantity `json:"ephemeral-storage,omitempty"`
}

// Quantity is a Kubernetes quantity such as "500m", "2" or "4Gi". In YAML a
// bare number (`cpu: 2`) is a JSON number, so both JSON numbers and strings are
// accepted; it is always kept as the string the step wrote.
type Quantity string

// UnmarshalJSON accepts a JSON string or number.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*q = Quantity(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("a quantity must be a string such as \"500m\" or a number such as 2, not %s", b)
	}
	*q = Quantity(n.String())
	return nil
}
