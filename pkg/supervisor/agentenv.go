package supervisor

import (
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
// when it runs a job (JobRunner.createEnvironment in v3.52.0). The pod builder sets the
// agent's configuration; these need the running process.
const (
	envAgentPID = "BUILDKITE_AGENT_PID"
	envEnvFile  = "BUILDKITE_ENV_FILE"
	envShell    = "BUILDKITE_SHELL"
	envBinPath  = "BUILDKITE_BIN_PATH"
	envPlugins  = "BUILDKITE_PLUGINS"

	envPluginValidation = "BUILDKITE_PLUGIN_VALIDATION"
	envMessage          = podcontract.EnvMessage
)

// runtimeEnv is the job's env with what the agent adds when it runs the job: its pid, the
// env file, the shell and BUILDKITE_PLUGINS (Buildkite sends it, empty for a step without
// plugins; the spawner drops it when the operator's own plugin was the only one), and the
// values the agent makes of the job's own (agentValues). cleanup removes the env file.
func (j *job) runtimeEnv() (env []string, cleanup func()) {
	env = append(slices.Clone(j.conf.Env), envAgentPID+"="+strconv.Itoa(os.Getpid()))
	if !isSet(env, envPlugins) {
		env = append(env, envPlugins+"=")
	}
	if lookup(env, envShell) == "" {
		env = append(env, envShell+"="+j.shell())
	}
	cleanup = func() {}
	// The env file has the job's env as Buildkite sent it: written before agentValues, as
	// the agent writes it.
	file, err := writeEnvFile(env, j.conf.JobID, j.conf.Workspace)
	env = agentValues(slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, podcontract.EnvReplacedPrefix) }))
	if err != nil {
		_ = j.stream.WriteLine(fmt.Sprintf("⚠️ Warning: the job has no %s: %v", envEnvFile, err))
		return env, cleanup
	}
	return append(env, envEnvFile+"="+file), func() { _ = os.Remove(file) }
}

// agentValues sets what the agent makes of two variables of the job's own env before it
// runs bootstrap (JobRunner.createEnvironment in v3.52.0). A step's
// BUILDKITE_PLUGIN_VALIDATION becomes "true" for "true", "1" or "on", else "false":
// bootstrap reads it as a bool, and fails on "on" as the step wrote it. (The pod builder has
// set it already when the step has none, or when the environment validates plugins; "true"
// and "false" stay as they are.) A BUILDKITE_MESSAGE longer than the agent passes on is cut
// to that length, with the agent's note of how much it cut.
func agentValues(env []string) []string {
	if v, ok := lookupSet(env, envPluginValidation); ok {
		env = append(env, envPluginValidation+"="+strconv.FormatBool(v == "true" || v == "1" || v == "on"))
	}
	if v, ok := lookupSet(env, envMessage); ok {
		if cut := podcontract.TruncateMessage(v); cut != v {
			env = append(env, envMessage+"="+cut)
		}
	}
	return env
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

// writeEnvFile writes the job's env as Buildkite gave it (the variables podcontract.EnvJobEnvNames
// lists, with the job's own value of those the agent's settings replace, from
// podcontract.EnvReplacedPrefix; without the list, everything but the operator's settings and
// the token) to a new file,
// as the agent does: NAME="value" lines, the value quoted as Go quotes strings. It goes to
// the temporary folder, as the agent's does, or under the workspace when the image has none
// it may write to.
func writeEnvFile(env []string, jobID, workspace string) (string, error) {
	var names []string
	if v, ok := lookupSet(env, podcontract.EnvJobEnvNames); ok {
		// BUILDKITE_PLUGINS is one of them however the spawner left it (see runtimeEnv).
		names = append(strings.Split(v, ","), envPlugins)
	} else {
		for _, kv := range env {
			k, _, _ := strings.Cut(kv, "=")
			if !strings.HasPrefix(k, "BK_OPERATOR_") && k != podcontract.EnvAccessToken && k != envAgentPID {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range slices.Compact(names) {
		v, ok := lookupSet(env, podcontract.EnvReplacedPrefix+n)
		if !ok {
			v, ok = lookupSet(env, n)
		}
		if ok && n != "" {
			fmt.Fprintf(&b, "%s=%q\n", n, v)
		}
	}
	pattern := "job-env-" + jobID
	f, err := os.CreateTemp("", pattern)
	if err != nil {
		dir := filepath.Join(workspace, ".buildkite-agent")
		err = os.MkdirAll(dir, 0o700)
		if err == nil {
			f, err = os.CreateTemp(dir, pattern)
		}
		if err != nil {
			return "", fmt.Errorf("creating it: %w", err)
		}
	}
	_, err = f.WriteString(b.String())
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
