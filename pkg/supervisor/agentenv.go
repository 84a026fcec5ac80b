package supervisor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Variables of the job's env that the supervisor sets, as `buildkite-agent start` does
// when it runs a job (JobRunner.createEnvironment in v3.138.1). The pod builder sets the
// agent's configuration; these need the running process.
const (
	envAgentPID    = "BUILDKITE_AGENT_PID"
	envEnvFile     = "BUILDKITE_ENV_FILE"
	envEnvJSONFile = "BUILDKITE_ENV_JSON_FILE"
	envShell       = "BUILDKITE_SHELL"
	envBinPath     = "BUILDKITE_BIN_PATH"
	envPlugins     = "BUILDKITE_PLUGINS"
	envIgnoredEnv  = "BUILDKITE_IGNORED_ENV"
	// (envJobTimeoutFile, in timeout.go, is the third file the agent names for the job.)

	// envRemoteMirrorURL is always in the agent's env files: it sets it (empty when the job
	// has none, as the pod builder does) before it writes them.
	envRemoteMirrorURL = "BUILDKITE_GIT_REMOTE_MIRROR_URL"

	envPluginValidation = "BUILDKITE_PLUGIN_VALIDATION"
	envMessage          = podcontract.EnvMessage
)

// runtimeEnv is the job's env with what the agent adds when it runs the job: its pid, the
// env files, the job timeout marker's path, the shell, BUILDKITE_PLUGINS (Buildkite sends
// it, empty for a step without plugins; the spawner drops it when the operator's own plugin
// was the only one), BUILDKITE_GIT_REMOTE_MIRROR_URL, and the values the agent makes of the
// job's own (agentValues). cleanup removes the files.
func (j *job) runtimeEnv() (env []string, cleanup func()) {
	env = append(slices.Clone(j.conf.Env), envAgentPID+"="+strconv.Itoa(os.Getpid()))
	if !isSet(env, envPlugins) {
		env = append(env, envPlugins+"=")
	}
	// The pod builder sets it; the supervisor of an older one's pod, or run outside a pod,
	// gives it as the agent does.
	if !isSet(env, envRemoteMirrorURL) {
		env = append(env, envRemoteMirrorURL+"=")
	}
	if lookup(env, envShell) == "" {
		env = append(env, envShell+"="+j.shell())
	}
	cleanup = func() {}
	// The env files have the job's env as Buildkite sent it: written before agentValues, as
	// the agent writes them.
	files, err := writeEnvFiles(env, j.conf.JobID, j.conf.Workspace)
	env = agentValues(env)
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, podcontract.EnvReplacedPrefix) })
	if err != nil {
		_ = j.stream.WriteLine(fmt.Sprintf("⚠️ Warning: the job has no %s nor %s: %v", envEnvFile, envEnvJSONFile, err))
		return env, cleanup
	}
	env = append(env, envEnvFile+"="+files.shell, envEnvJSONFile+"="+files.json)
	// The environment's env may name the marker, as the agent's configuration would.
	if lookup(env, envJobTimeoutFile) == "" {
		env = append(env, envJobTimeoutFile+"="+files.timeout)
	}
	return env, func() {
		for _, f := range []string{files.shell, files.json, files.timeout} {
			_ = os.Remove(f)
		}
	}
}

// agentValues sets what the agent makes of two variables of the job's own env before it
// runs bootstrap (JobRunner.createEnvironment in v3.138.1), and drops the job's own values
// of the agent's settings (podcontract.EnvReplacedPrefix), which it reads.
//
// BUILDKITE_PLUGIN_VALIDATION is "true" when the agent's configuration (the environment)
// or the job's own value, "true", "1" or "on", asks for it, else "false": bootstrap reads it
// as a bool, and fails on "on" as the step wrote it. A job's value that does not turn it on
// is ignored, as the agent ignores it, and named in BUILDKITE_IGNORED_ENV. (The pod builder
// has set the environment's value, and left the step's, or put it under
// podcontract.EnvReplacedPrefix when the environment validates.) A BUILDKITE_MESSAGE
// longer than the agent passes on is cut to that length, with the agent's note of how much
// it cut.
func agentValues(env []string) []string {
	if v, ignored, ok := pluginValidation(env); ok {
		env = append(env, envPluginValidation+"="+strconv.FormatBool(v))
		if ignored {
			env = append(env, envIgnoredEnv+"="+withIgnored(lookup(env, envIgnoredEnv), envPluginValidation))
		}
	}
	if v, ok := lookupSet(env, envMessage); ok {
		if cut := podcontract.TruncateMessage(v); cut != v {
			env = append(env, envMessage+"="+cut)
		}
	}
	return env
}

// pluginValidation is the agent's BUILDKITE_PLUGIN_VALIDATION for the job, whether the job's
// own value is ignored, and whether the variable is set at all.
func pluginValidation(env []string) (on, ignored, ok bool) {
	enables := func(v string) bool { return v == "true" || v == "1" || v == "on" }
	value, set := lookupSet(env, envPluginValidation)
	names, haveNames := lookupSet(env, podcontract.EnvJobEnvNames)
	if !haveNames || !slices.Contains(strings.Split(names, ","), envPluginValidation) {
		// The job has no value of its own (or, in a pod of an older pod builder, no list
		// of what it has): what is there is the configuration's.
		return enables(value), false, set
	}
	configured, jobValue := false, value
	if replaced, ok := lookupSet(env, podcontract.EnvReplacedPrefix+envPluginValidation); ok {
		configured, jobValue = enables(value), replaced
	}
	return configured || enables(jobValue), !enables(jobValue), true
}

// withIgnored adds name to a BUILDKITE_IGNORED_ENV list where the agent would name it:
// before the two settings it sets after plugin validation.
func withIgnored(list, name string) string {
	var names []string
	if list != "" {
		names = strings.Split(list, ",")
	}
	i := slices.IndexFunc(names, func(n string) bool {
		return n == "BUILDKITE_JOB_LOGS_OTLP" || n == "BUILDKITE_AGENT_DISABLE_WARNINGS_FOR"
	})
	if i < 0 {
		i = len(names)
	}
	return strings.Join(slices.Insert(names, i, name), ",")
}

// shell is the shell the job's commands run under: the Command runner's own, or the
// agent's default when the image has it (else a plain sh, with a note in the log).
func (j *job) shell() string {
	if j.conf.Runner != podcontract.RunnerBootstrap {
		return fallbackShell
	}
	if _, err := os.Stat(agentDefaultShell); err != nil {
		// Images built on busybox or alpine have no bash, and the agent's default shell would
		// fail every hook and command with "no such file".
		_ = j.stream.WriteLine(fmt.Sprintf("# This image has no %s: commands and hooks run under %s (set BUILDKITE_SHELL in the BuildEnvironment to choose another shell)", agentDefaultShell, fallbackShell))
		return fallbackShell
	}
	return agentDefaultShell + " -e -c"
}

// envFiles are the files the agent makes for a job in its job context folder: the env
// file, the same as JSON, and the marker of a Buildkite timeout (made only when one cancels
// the job).
type envFiles struct {
	shell, json, timeout string
}

// writeEnvFiles writes the job's env as Buildkite gave it (the variables
// podcontract.EnvJobEnvNames lists, with the job's own value of those the agent's settings
// replace, from podcontract.EnvReplacedPrefix, and BUILDKITE_GIT_REMOTE_MIRROR_URL; without
// the list, everything but the operator's settings and the token) to two new files, as the
// agent does: BUILDKITE_ENV_FILE's NAME="value" lines, the value quoted as Go quotes
// strings, and BUILDKITE_ENV_JSON_FILE's one JSON object. They go to the temporary folder,
// as the agent's do, or under the workspace when the image has none it may write to; the
// timeout marker's path is beside them.
func writeEnvFiles(env []string, jobID, workspace string) (envFiles, error) {
	var names []string
	if v, ok := lookupSet(env, podcontract.EnvJobEnvNames); ok {
		// BUILDKITE_PLUGINS is one of them however the spawner left it (see runtimeEnv).
		names = append(strings.Split(v, ","), envPlugins, envRemoteMirrorURL)
	} else {
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(k, "BK_OPERATOR_") && k != podcontract.EnvAccessToken && k != envAgentPID {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	values := map[string]string{}
	var shell strings.Builder
	for _, n := range slices.Compact(names) {
		v, ok := lookupSet(env, podcontract.EnvReplacedPrefix+n)
		if !ok {
			v, ok = lookupSet(env, n)
		}
		if ok && n != "" {
			values[n] = v
			fmt.Fprintf(&shell, "%s=%q\n", n, v)
		}
	}
	// As the agent encodes it: json.Encoder's defaults (HTML characters escaped), keys
	// sorted, a newline at the end.
	var js bytes.Buffer
	if err := json.NewEncoder(&js).Encode(values); err != nil {
		return envFiles{}, fmt.Errorf("encoding the env as JSON: %w", err)
	}
	dir := os.TempDir()
	shellFile, err := writeTemp(dir, "job-env-"+jobID, shell.String())
	if err != nil {
		dir = filepath.Join(workspace, ".buildkite-agent")
		if err = os.MkdirAll(dir, 0o700); err == nil {
			shellFile, err = writeTemp(dir, "job-env-"+jobID, shell.String())
		}
		if err != nil {
			return envFiles{}, err
		}
	}
	jsonFile, err := writeTemp(dir, "job-env-json-"+jobID, js.String())
	if err != nil {
		_ = os.Remove(shellFile)
		return envFiles{}, err
	}
	return envFiles{shell: shellFile, json: jsonFile, timeout: filepath.Join(dir, "job-timeout-"+jobID)}, nil
}

// writeTemp writes content to a new file in dir named from pattern, as os.CreateTemp names
// it, and returns its path.
func writeTemp(dir, pattern, content string) (string, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", fmt.Errorf("creating it: %w", err)
	}
	_, err = f.WriteString(content)
	if err = errors.Join(err, f.Close()); err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	return f.Name(), nil
}

// findAgent is the buildkite-agent that runs bootstrap: the operator's, which the pod's
// install container put in BUILDKITE_BIN_PATH, else one on the job's PATH (an image that
// brings its own, or the supervisor run outside a pod).
func findAgent(env []string) (string, error) {
	if dir := lookup(env, envBinPath); dir != "" {
		p := filepath.Join(dir, "buildkite-agent")
		if isExecutable(p) {
			return p, nil
		}
	}
	p, err := lookPath("buildkite-agent", env)
	if err != nil {
		return "", fmt.Errorf("the environment's runner is Bootstrap, but there is no buildkite-agent in %s=%q (where the operator's install container copies it) nor on the image's PATH: check the operator image (`make image` puts the agent in it), or use the Command runner: %w",
			envBinPath, lookup(env, envBinPath), err)
	}
	return p, nil
}

// withBinPath appends BUILDKITE_BIN_PATH to the job's PATH, as bootstrap does, so that
// `buildkite-agent meta-data ...` works under the Command runner too.
func withBinPath(env []string) []string {
	dir := lookup(env, envBinPath)
	if dir == "" {
		return env
	}
	path := lookup(env, "PATH")
	if path != "" {
		path += string(os.PathListSeparator)
	}
	return append(env, "PATH="+path+dir)
}

func isExecutable(p string) bool {
	info, err := os.Stat(p)
	return err == nil && !info.IsDir() && info.Mode()&0o111 != 0
}

// isSet reports whether env sets name, even to nothing.
func isSet(env []string, name string) bool {
	_, ok := lookupSet(env, name)
	return ok
}

// lookupSet is lookup that tells an unset variable from an empty one.
func lookupSet(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}
