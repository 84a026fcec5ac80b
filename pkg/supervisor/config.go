package supervisor

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// Defaults for settings the controller normally sets; they match the agent's.
const (
	DefaultChunkMaxBytes     = 100 * 1024
	DefaultChunkInterval     = time.Second
	DefaultJobStatusInterval = time.Second
	// DefaultSignalGrace is the agent's: cancel-grace-period (10 s) less one second.
	DefaultSignalGrace = 9 * time.Second
	// maxChunkBytes bounds the chunk size, whose buffers are allocated whole: Buildkite's
	// is 100 KiB.
	maxChunkBytes = 64 << 20
	// maxSettingSeconds bounds the settings given in seconds: a day.
	maxSettingSeconds = 24 * 60 * 60
	// DefaultLogMaxBytes is the agent's when Buildkite gives no log_max_size_bytes: 1 GiB.
	DefaultLogMaxBytes = 1 << 30
	// maxTimeoutSeconds bounds EnvTimeoutSeconds: the longest timeout a BuildJob may have
	// (spec.timeoutMinutes at most 10080, a week).
	maxTimeoutSeconds = 7 * 24 * 60 * 60
)

// Config is everything the supervisor needs to run one job.
type Config struct {
	Endpoint string
	// Token is the job token. It is passed on to the job (as BUILDKITE_AGENT_ACCESS_TOKEN, so
	// that buildkite-agent meta-data and friends work) and never printed.
	Token   string
	JobID   string
	Command string
	Runner  string
	// LogPaths are files streamed into the log as they grow.
	LogPaths []string

	ChunkMaxBytes     int
	ChunkInterval     time.Duration
	JobStatusInterval time.Duration
	SignalGrace       time.Duration
	// LogMaxBytes is the most log Buildkite keeps (Job.log_max_size_bytes): past it the
	// supervisor warns once in its own log and goes on sending, as the agent does.
	LogMaxBytes int64
	// Timeout, when above zero, is how long the job may run from its start: then its
	// command is stopped as on a cancel and the job ends with exit status -1.
	// TimeoutSource says whose it is (podcontract.TimeoutSourceStep or
	// TimeoutSourceEnvironment), for the log line.
	Timeout       time.Duration
	TimeoutSource string

	// ProgressPath is the termination message file.
	ProgressPath string
	// Workspace is the job's working directory and checkout.
	Workspace string
	// Finish makes the supervisor finish the job itself, however its output went
	// (standalone use).
	Finish bool
	// FinishFlushed makes the supervisor finish the job itself once the command has ended
	// and all its output is sent, and record so in its progress (in a pod: the controller
	// finishes a job only when the supervisor could not).
	FinishFlushed bool
	// Reap makes the supervisor reap every child process, as PID 1 of its container must,
	// and adopt the orphans of the job (a subreaper). It takes the exit status of every
	// child of the process, so only a process of its own may set it: Main does.
	Reap bool

	// Local runs the job of a BuildJob made by hand (podcontract.EnvLocal): no token, no
	// endpoint, nothing started, streamed or finished on Buildkite; the command's output
	// goes to Stdout, and Finish and FinishFlushed do nothing.
	Local bool
	// Stdout receives a local job's output (os.Stdout when nil): in a pod, kubectl logs
	// shows it.
	Stdout io.Writer

	// Env is the job's environment, passed to the command.
	Env []string
	// UserAgent names the supervisor to Buildkite.
	UserAgent string
	// RetryWaitScale scales the waits between API retries; tests make it small. 1 when zero.
	RetryWaitScale float64
}

// ConfigFromEnv reads the settings the controller puts in the job container's environment
// (pkg/podcontract). env is the whole environment, as os.Environ returns it; it also becomes
// the job's environment.
func ConfigFromEnv(env []string) (Config, error) {
	get := func(k string) string { return lookup(env, k) }
	c := Config{
		Endpoint:     get(podcontract.EnvEndpoint),
		Token:        get(podcontract.EnvAccessToken),
		JobID:        get(podcontract.EnvJobID),
		Command:      get(podcontract.EnvCommand),
		Runner:       get(podcontract.EnvRunner),
		ProgressPath: get(podcontract.EnvProgressPath),
		Workspace:    podcontract.WorkspaceDir,
		Env:          env,
	}
	if c.Runner == "" {
		c.Runner = podcontract.DefaultRunner
	}
	if c.ProgressPath == "" {
		c.ProgressPath = jobprogress.DefaultPath
	}
	for _, p := range strings.Split(get(podcontract.EnvLogPaths), ";") {
		if p = strings.TrimSpace(p); p != "" {
			c.LogPaths = append(c.LogPaths, p)
		}
	}
	var errs []error
	if v := get(podcontract.EnvLocal); v != "" {
		local, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s is %q: it must be true or false", podcontract.EnvLocal, v))
		}
		c.Local = local
	}
	c.ChunkMaxBytes, errs = intEnv(get, podcontract.EnvChunkMaxBytes, DefaultChunkMaxBytes, maxChunkBytes, errs)
	c.ChunkInterval, errs = secondsEnv(get, podcontract.EnvChunkInterval, DefaultChunkInterval, errs)
	c.JobStatusInterval, errs = secondsEnv(get, podcontract.EnvJobStatusInterval, DefaultJobStatusInterval, errs)
	c.SignalGrace, errs = secondsEnv(get, podcontract.EnvSignalGrace, DefaultSignalGrace, errs)
	c.LogMaxBytes, errs = int64Env(get, podcontract.EnvLogMaxBytes, DefaultLogMaxBytes, errs)
	c.Timeout, errs = timeoutEnv(get, errs)
	c.TimeoutSource = get(podcontract.EnvTimeoutSource)
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, nil
}

func intEnv(get func(string) string, name string, def, most int, errs []error) (int, []error) {
	v := get(name)
	if v == "" {
		return def, errs
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 || n > most {
		return def, append(errs, fmt.Errorf("%s is %q: it must be a whole number from 1 to %d", name, v, most))
	}
	return n, errs
}

// int64Env reads a positive count of bytes.
func int64Env(get func(string) string, name string, def int64, errs []error) (int64, []error) {
	v := get(name)
	if v == "" {
		return def, errs
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return def, append(errs, fmt.Errorf("%s is %q: it must be a whole number above 0", name, v))
	}
	return n, errs
}

// timeoutEnv reads EnvTimeoutSeconds: zero (or unset) for no timeout. Its bound is the
// longest timeout a BuildJob may ask for, not secondsEnv's day.
func timeoutEnv(get func(string) string, errs []error) (time.Duration, []error) {
	name := podcontract.EnvTimeoutSeconds
	v := get(name)
	if v == "" {
		return 0, errs
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0 && f <= maxTimeoutSeconds) {
		// No timeout rather than a wrong one: the pod's activeDeadlineSeconds still ends a
		// job that runs for ever.
		return 0, append(errs, fmt.Errorf("%s is %q: it must be a number of seconds, from 0 to %d", name, v, maxTimeoutSeconds))
	}
	return time.Duration(f * float64(time.Second)), errs
}

func secondsEnv(get func(string) string, name string, def time.Duration, errs []error) (time.Duration, []error) {
	v := get(name)
	if v == "" {
		return def, errs
	}
	f, err := strconv.ParseFloat(v, 64)
	// NaN, Inf and huge numbers do not fit a time.Duration: converted, Inf became a negative
	// grace period, and SIGKILL came at once.
	if err != nil || !(f >= 0 && f <= maxSettingSeconds) {
		return def, append(errs, fmt.Errorf("%s is %q: it must be a number of seconds, from 0 to %d", name, v, maxSettingSeconds))
	}
	return time.Duration(f * float64(time.Second)), errs
}

// validate says what is missing, naming the variables that set it.
func (c *Config) validate() error {
	var errs []error
	need := func(v, name string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is not set", name))
		}
	}
	// A local job (a BuildJob made by hand) talks to no Buildkite, so it has neither.
	if !c.Local {
		need(c.Endpoint, podcontract.EnvEndpoint)
		need(c.Token, podcontract.EnvAccessToken)
	}
	need(c.JobID, podcontract.EnvJobID)
	need(c.Workspace, "the workspace directory (--workspace)")
	switch c.Runner {
	case podcontract.RunnerCommand:
		need(c.Command, podcontract.EnvCommand)
	case podcontract.RunnerBootstrap:
	default:
		errs = append(errs, fmt.Errorf("%s is %q: use %s or %s", podcontract.EnvRunner, c.Runner, podcontract.RunnerCommand, podcontract.RunnerBootstrap))
	}
	if c.ChunkMaxBytes <= 0 {
		errs = append(errs, fmt.Errorf("%s must be above 0", podcontract.EnvChunkMaxBytes))
	}
	return errors.Join(errs...)
}
