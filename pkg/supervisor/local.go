package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/logstream"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// localNotice is the first line of a local job's output: whoever reads kubectl logs learns
// at once why nothing of this job shows in Buildkite.
const localNotice = "# This BuildJob was made by hand, not by the operator from a Buildkite job: it runs without Buildkite (no job token; nothing is started, logged or finished there), and its output is only here"

// localAgentNotice says what the agent's subcommands do without Buildkite: they fail on the
// missing token before they send anything.
const localAgentNotice = "# buildkite-agent meta-data, annotate, artifact and pipeline upload have no Buildkite to talk to: they fail"

// Output settings of a local job. Buildkite's chunk limits do not apply to stdout, and a
// short interval shows the output in `kubectl logs -f` soon after it is written.
const (
	localChunkBytes = DefaultChunkMaxBytes
	localInterval   = 200 * time.Millisecond
)

// inlineTimestamp is the timestamp the log stream puts at the start of every line for
// Buildkite: noise on stdout, where kubectl logs --timestamps gives its own. The stream
// keeps each one whole within a chunk, so each chunk can be cleaned on its own.
var inlineTimestamp = regexp.MustCompile("\x1b_bk;t=[0-9]+\a")

// localCommandRunner ends the first line of output when a local job's Bootstrap runner
// gives way to the Command runner (see localBootstrap).
const localCommandRunner = "; its BuildJob gives no BUILDKITE_REPO in spec.env, which buildkite-agent bootstrap needs, so the command runs under the Command runner (no hooks, no plugins)"

// localBootstrapDefaults are what `buildkite-agent bootstrap` (v3.52.0) refuses to run
// without and Buildkite sends with every job, for a local job whose env does not give them.
// Commit and branch HEAD check out the repository's default branch.
var localBootstrapDefaults = map[string]string{
	"BUILDKITE_COMMIT":            "HEAD",
	"BUILDKITE_BRANCH":            "HEAD",
	"BUILDKITE_ORGANIZATION_SLUG": "local",
	"BUILDKITE_PIPELINE_SLUG":     "local",
	"BUILDKITE_PIPELINE_PROVIDER": "local",
}

// localBootstrap readies a local job's Bootstrap runner, and reports false when the job
// must run under the Command runner instead.
//
// Bootstrap stays bootstrap wherever it can, rather than the Command runner in its place:
// trying an environment means its hooks, plugins, checkout and shell, which only bootstrap
// runs, and bootstrap calls no agent API of its own (v3.52.0): it skips sending the commit
// to Buildkite when there is no token, with a warning, and only what calls Buildkite
// (meta-data, annotate, artifact and pipeline upload, from the command, a hook, or
// BUILDKITE_ARTIFACT_PATHS) fails, at once, on the missing token. But bootstrap refuses to
// run without a repository, a commit, a branch, an organization, a pipeline and a
// provider, which Buildkite sends with every job: the job gets defaults for all but the
// repository. A repository cannot be made up (a placeholder would be cloned, or shown to
// hooks as the job's), so a job without BUILDKITE_REPO runs its command under the Command
// runner, and the first line of its output says so.
func localBootstrap(conf *Config) bool {
	if lookup(conf.Env, "BUILDKITE_REPO") == "" {
		conf.Runner = podcontract.RunnerCommand
		return false
	}
	conf.Env = setDefaults(conf.Env, localBootstrapDefaults)
	return true
}

// runLocal runs the job of a BuildJob made by hand (Config.Local), to try a BuildEnvironment
// without Buildkite: the same runner (see localBootstrap), env, redaction and stop on
// SIGTERM as any job, but nothing is started, streamed or finished on Buildkite. The output
// goes to conf.Stdout, and the progress record says how the command ended, never that the
// job started or was finished on Buildkite.
func runLocal(ctx context.Context, conf Config, rec *recorder, logf func(string, ...any)) (Result, error) {
	out := conf.Stdout
	if out == nil {
		out = os.Stdout
	}
	// Whatever the environment put there (an env var, an envFrom), the job gets no way to
	// Buildkite from the operator: a token and endpoint in the supervisor's env are the
	// environment's, and a BuildJob made by hand must not use them through the operator.
	// The token is still redacted, should the command print it from elsewhere.
	var dropped []string
	conf.Env = slices.DeleteFunc(slices.Clone(conf.Env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		if k != podcontract.EnvAccessToken && k != podcontract.EnvEndpoint {
			return false
		}
		if !slices.Contains(dropped, k) {
			dropped = append(dropped, k)
		}
		return true
	})
	redactor, notes := redactorFor(conf)
	stream, err := logstream.New(logstream.Config{
		Redactor:      redactor,
		Uploaders:     1, // in order: stdout takes them one after the other
		MaxChunkBytes: localChunkBytes,
		Interval:      min(conf.ChunkInterval, localInterval),
		Upload: func(_ context.Context, _, _ uint64, data []byte) error {
			if _, err := out.Write(inlineTimestamp.ReplaceAll(data, nil)); err != nil {
				return fmt.Errorf("writing the job's output to stdout: %w", err)
			}
			return nil
		},
		OnChunk: func(st logstream.Stats, err error) {
			// Not recorded in the progress: its log counts are what Buildkite acknowledged.
			if err != nil {
				logf("output chunk %d (ending at offset %d) is lost: %v", st.Sequence, st.Offset, err)
			}
		},
		ResumeHeading: "~~~ Command output (continued)",
	})
	if err != nil {
		rec.failed(err)
		return Result{ExitStatus: -1, ExitCode: 1}, fmt.Errorf("starting the output of a local job: %w", err)
	}
	notice := localNotice
	if conf.Runner == podcontract.RunnerBootstrap && !localBootstrap(&conf) {
		notice += localCommandRunner
	}
	_ = stream.WriteLine(notice)
	_ = stream.WriteLine(localAgentNotice)
	if len(dropped) > 0 {
		slices.Sort(dropped)
		_ = stream.WriteLine(fmt.Sprintf("# The job does not get %s: its environment set them, but a BuildJob made by hand talks to no Buildkite through the operator", strings.Join(dropped, " and ")))
	}

	j := &job{conf: conf, stream: stream, logf: logf, notes: notes, startedAt: time.Now()}
	j.printIntakeLog()
	res := j.execute(ctx, rec, nil)

	closeCtx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	stats, closeErr := stream.Close(closeCtx)
	res.Log = stats
	rec.update(func(p *jobprogress.Progress) { p.Flushed = closeErr == nil })
	if closeErr != nil {
		logf("%v", closeErr)
	}
	return res, errors.Join(closeErr, j.err)
}
