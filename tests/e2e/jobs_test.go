package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	corev1 "k8s.io/api/core/v1"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// jobCase is one job on a real pod and what Buildkite must see of it.
type jobCase struct {
	name     string
	pipeline string // the steps; agents: queue: bk-operator is added
	// rawPipeline: pipeline is the whole upload, its queue included, sent as it is: a
	// signed pipeline marshalled as JSON, which YAML lines cannot be put in front of.
	rawPipeline bool
	// message is the build's commit message; default the test's name.
	message string
	repo    string
	commit  string
	// during runs while the job runs, once its log contains waitFor.
	waitFor string
	during  func(t *testing.T, e *harness.Env, jobID string)
	// notice: while the job waits, before it starts, it shows a notice of what it waits
	// for that has every one of these; noticeSince, when set, is when Kubernetes recorded
	// what delays the job, which the notice must follow within noticeDelay.
	notice      []string
	noticeSince func(ctx context.Context, e *harness.Env, jobID string) (time.Time, bool)
	// want
	state        string
	exitStatus   string // "" means any non-zero status
	signalReason string
	logHas       []string
	logHasNot    []string
	check        func(t *testing.T, e *harness.Env, j fakebuildkite.JobSnapshot)
	// maxRun bounds the time from the job's start to its finish, when set.
	maxRun  time.Duration
	timeout time.Duration
}

func TestJobs(t *testing.T) {
	e := needEnv(t)
	cases := []jobCase{
		{
			name:     "passing step",
			pipeline: "steps:\n  - command: echo hello from e2e\n",
			state:    fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"hello from e2e"},
		},
		{
			// Under the Command runner: the command under a shell, no bootstrap.
			name:     "exit 3",
			pipeline: "steps:\n  - command: echo failing on purpose; exit 3\n    env:\n      BK_OPERATOR_BUILD_ENVIRONMENT: command\n",
			state:    fakebuildkite.StateFinished, exitStatus: "3",
			logHas: []string{"failing on purpose"},
		},
		{
			// Issue 24: the kubelet expands $(NAME) and $$ in a pod's literal env values, and
			// the Command runner reads the command from one (BK_OPERATOR_COMMAND); the
			// bootstrap takes BUILDKITE_COMMAND from the token Secret, never expanded. The
			// fake, like Buildkite after `pipeline upload`, hands the command over verbatim
			// (no interpolation of the pipeline), so each output line is exactly as
			// written; a line starts after "\n", unlike the command echoed as "$ ...".
			name: "a command full of $, quotes and backslashes runs verbatim",
			pipeline: `steps:
  - command: |
      printf '%s\n' 'dollar: $$ paren: $(HOME) $(BUILDKITE_JOB_ID) brace: ${NOPE:-x} end: $'
      printf '%s\n' "back\\slash \"double\" 'single' \$(BK_OPERATOR_JOB_ID)"
      kill -0 $$ && echo "own pid: ok"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: command
`,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{
				"\ndollar: $$ paren: $(HOME) $(BUILDKITE_JOB_ID) brace: ${NOPE:-x} end: $",
				`back\slash "double" 'single' $(BK_OPERATOR_JOB_ID)`,
				"\nown pid: ok",
			},
		},
		{
			name: "checkout of a local repository at a commit",
			pipeline: `steps:
  - command: echo "HEAD is $(git rev-parse HEAD)"; cat file.txt
    plugins:
      - buildkite-operator#v0.1.0:
          build_environment: git
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas:    []string{"HEAD is " + repo.First, "version one"},
			logHasNot: []string{"version two"},
		},
		{
			name: "bootstrap with a repository hook and meta-data",
			pipeline: `steps:
  - command: buildkite-agent meta-data set e2e-key e2e-value && echo "meta-data set"
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: bootstrap-git
`,
			repo: repoMount, commit: repo.First,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"repository pre-command hook ran at version one", "meta-data set",
				"This image has no /bin/bash: commands and hooks run under /bin/sh -e -c"},
			check: func(t *testing.T, e *harness.Env, j fakebuildkite.JobSnapshot) {
				b, ok := e.Fake.Build(j.BuildID)
				require.True(t, ok)
				assert.Equal(t, "e2e-value", b.MetaData["e2e-key"], "the build's meta-data")
			},
		},
		{
			name: "cancel from Buildkite while running",
			pipeline: `steps:
  - command: trap 'echo "got SIGTERM"; exit 143' TERM; echo "waiting to be canceled"; while true; do sleep 1; done
`,
			waitFor: "waiting to be canceled",
			during: func(t *testing.T, e *harness.Env, jobID string) {
				require.NoError(t, e.Fake.CancelJob(jobID))
			},
			state: fakebuildkite.StateCanceled, signalReason: "cancel",
			logHas: []string{"The job was canceled on Buildkite: sent SIGTERM to the command", "got SIGTERM"},
			maxRun: 20 * time.Second,
		},
		{
			name: "timeout",
			pipeline: `steps:
  - command: echo "running past the timeout"; while true; do sleep 1; done
    timeout_in_minutes: 1
`,
			state: fakebuildkite.StateTimedOut, signalReason: "cancel",
			logHas: []string{"running past the timeout", "The job timed out on Buildkite: sent SIGTERM to the command"},
			// One "minute" and a few status polls: no SIGKILL grace period is needed,
			// as the shell ends on SIGTERM.
			maxRun: minute + 15*time.Second,
		},
		{
			name: "OOM killed by the memory limit",
			pipeline: `steps:
  - command: echo "allocating"; x=$(head -c 200000000 /dev/zero | tr '\0' a); echo "survived with ${#x} bytes"
    plugins:
      - buildkite-operator#v0.1.0:
          build_environment: small
`,
			state:     fakebuildkite.StateFinished,
			logHas:    []string{"out of memory", "OOMKilled"},
			logHasNot: []string{"\nsurvived with"}, // the output line, not the command shown above it
		},
		{
			name: "image that is not present",
			pipeline: `steps:
  - command: echo never runs
    plugins:
      - buildkite-operator#v0.1.0:
          build_environment: missing-image
`,
			state: fakebuildkite.StateFinished, exitStatus: "-1", signalReason: "stack_error",
			logHas:    []string{`The image "bk-operator/no-such-image:dev" of container "job" is not on the node, and its pull policy is Never`},
			logHasNot: []string{"never runs"},
		},
		{
			// The agent's image, mounted as an image volume on this node (containerd 2):
			// the kubelet reports its failure as the job container's, and the log names
			// the agent's image, not the job's.
			name: "agent image that is not present",
			pipeline: `steps:
  - command: echo never runs
    plugins:
      - buildkite-operator#v0.1.0:
          build_environment: missing-agent-image
`,
			state: fakebuildkite.StateFinished, exitStatus: "-1", signalReason: "stack_error",
			logHas:    []string{`The image "bk-operator/no-such-agent:dev" of container "job" is not on the node, and its pull policy is Never`},
			logHasNot: []string{"never runs"},
		},
		{
			name: "20 MB of output arrives complete and in order",
			pipeline: `steps:
  - command: awk 'BEGIN { for (i = 1; i <= 200000; i++) printf "line %07d abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz0123\n", i }'
`,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			check:   checkNumberedLines(200000),
			timeout: 5 * time.Minute,
		},
		{
			name: "log_paths content appears",
			pipeline: `steps:
  - command: echo "from the service log file" > /workspace/service.log; echo "command done"
    plugins:
      - buildkite-operator#v0.1.0:
          log_paths:
            - /workspace/service.log
`,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"command done", "from the service log file"},
		},
		{
			// The agent truncates an env value that the kernel would refuse (exec's
			// E2BIG for one string of 128 KiB or more), and so does the operator: a long
			// commit message is cut, and the job runs.
			name:    "a 200 KiB commit message runs",
			message: strings.Repeat("a long commit message, line after line of it\n", 200*1024/45),
			pipeline: `steps:
  - command: echo "the step ran with a message of $(printf %s "$BUILDKITE_MESSAGE" | wc -c) bytes"
`,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"the step ran with a message of "},
		},
		{
			// The plugin's own timeout (Buildkite does not know it): the supervisor ends
			// the command at the deadline, says which timeout fired, and finishes the job
			// then, not at the pod's deadline ten minutes later. A real minute: the
			// plugin's least.
			name: "the plugin's timeout_in_minutes ends the command at its deadline",
			pipeline: `steps:
  - command: echo "sleeping past the plugin's timeout"; sleep 300
    plugins:
      - buildkite-operator#v0.1.0:
          timeout_in_minutes: 1
`,
			state: fakebuildkite.StateFinished, exitStatus: "-1", signalReason: "cancel",
			logHas: []string{"sleeping past the plugin's timeout", "The job ran past its timeout of 1 minute, set by the step"},
			maxRun: time.Minute + 40*time.Second,
		},
		{
			// A background process that keeps printing after the command exits: the agent
			// stops reading output a bounded time after the command ends, and so must the
			// supervisor, or the job never finishes.
			name: "a command that leaves a chatty background process finishes",
			pipeline: `steps:
  - command: (while true; do echo "tick from the background"; sleep 0.2; done) & echo "the command left a chatty background process"
`,
			state: fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"the command left a chatty background process"},
			maxRun: 45 * time.Second,
		},
	}
	missing := gen.BuildEnvironment("missing-image",
		gen.SetBuildEnvironmentImage("bk-operator/no-such-image:dev"), gen.SetBuildEnvironmentImagePullPolicy(corev1.PullNever))
	require.NoError(t, e.ApplyEnvironment(context.Background(), missing))
	missingAgent := gen.BuildEnvironment("missing-agent-image",
		gen.SetBuildEnvironmentImage(e.Opts.JobImage), gen.SetBuildEnvironmentImagePullPolicy(e.Opts.JobImagePullPolicy))
	missingAgent.Spec.Agent.Image, missingAgent.Spec.Agent.ImagePullPolicy = "bk-operator/no-such-agent:dev", corev1.PullNever
	require.NoError(t, e.ApplyEnvironment(context.Background(), missingAgent))
	// Steps that use the agent's features: plugins from git, agent hooks from a ConfigMap,
	// artifacts and meta-data across steps, an annotation, a pipeline upload, a redacted Secret.
	setupAgentFeatures(t, e)
	cases = append(cases, agentFeatureCases()...)
	// Pods that wait: for a node, for an image, for quota.
	setupPending(t, e)
	cases = append(cases, pendingCases()...)

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runCase(t, e, tc)
		})
	}
}

// runCase runs one build with one step and checks how its job ended.
func runCase(t *testing.T, e *harness.Env, tc jobCase) fakebuildkite.JobSnapshot {
	t.Helper()
	timeout := tc.timeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	upload := "agents:\n  queue: bk-operator\n" + tc.pipeline
	if tc.rawPipeline {
		upload = tc.pipeline
	}
	message := tc.message
	if message == "" {
		message = t.Name()
	}
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline:     "e2e",
		PipelineYAML: upload,
		Repo:         tc.repo, Commit: tc.commit, Message: message,
	})
	require.NoError(t, err)
	require.Len(t, b.Jobs, 1)
	id := b.Jobs[0]
	if len(tc.notice) > 0 {
		waitForNotice(ctx, t, e, id, tc.notice, tc.noticeSince)
	}
	if tc.during != nil {
		_, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool {
			return strings.Contains(fakebuildkite.PlainLog(j.Log), tc.waitFor) || fakebuildkite.IsTerminal(j.State)
		})
		require.NoError(t, err, "waiting for %q in the job's log", tc.waitFor)
		tc.during(t, e, id)
	}
	j, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
	require.NoError(t, err, "job %s did not end; the operator's log ends:\n%s", id, e.Operator.Tail(30))
	recordTiming("%-50s pickup %-8s finished after %s", t.Name(), j.AcceptedAt.Sub(j.CreatedAt).Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond))

	log := fakebuildkite.PlainLog(j.Log)
	shown := log
	if len(shown) > 4000 {
		shown = shown[:2000] + "\n...\n" + shown[len(shown)-2000:]
	}
	assert.Equal(t, tc.state, j.State, "state; log:\n%s", shown)
	if tc.exitStatus != "" {
		assert.Equal(t, tc.exitStatus, j.ExitStatus, "exit status; log:\n%s", shown)
	} else {
		assert.NotContains(t, []string{"", "0"}, j.ExitStatus, "exit status should be a failure; log:\n%s", shown)
	}
	if tc.signalReason != "" {
		assert.Equal(t, tc.signalReason, j.SignalReason, "signal reason")
	}
	assert.Equal(t, 1, j.FinishCount, "finish is called exactly once")
	if a, ok := waitNotice(j); ok {
		assert.Fail(t, "the notice of what the job waited for outlived the job", "%+v", a)
	}
	for _, s := range tc.logHas {
		assert.Contains(t, strings.ToLower(log), strings.ToLower(s), "log:\n%s", shown)
	}
	for _, s := range tc.logHasNot {
		assert.NotContains(t, log, s)
	}
	if tc.maxRun > 0 {
		assert.Less(t, j.FinishedAt.Sub(j.StartedAt), tc.maxRun, "from start (%s) to finish (%s); log:\n%s",
			j.StartedAt.UTC().Format(timeOfDay), j.FinishedAt.UTC().Format(timeOfDay), fakebuildkite.TimedLog(j.Log))
	}
	if tc.check != nil {
		tc.check(t, e, j)
	}
	return j
}

// timeOfDay is how times are shown next to a timed log (fakebuildkite.TimedLog).
const timeOfDay = "15:04:05.000"

var numberedLine = regexp.MustCompile(`(?m)^line (\d{7}) abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz0123$`)

// checkNumberedLines checks that lines 1..n each appear once, whole and in order.
func checkNumberedLines(n int) func(*testing.T, *harness.Env, fakebuildkite.JobSnapshot) {
	return func(t *testing.T, _ *harness.Env, j fakebuildkite.JobSnapshot) {
		log := fakebuildkite.PlainLog(j.Log)
		matches := numberedLine.FindAllStringSubmatch(log, -1)
		require.Len(t, matches, n, "whole numbered lines in a log of %d bytes", len(log))
		for i, m := range matches {
			got, _ := strconv.Atoi(m[1])
			if got != i+1 {
				t.Fatalf("line %d of the output is numbered %d: output is out of order or lost", i+1, got)
			}
		}
		t.Logf("log of %d bytes (%d chunks)", len(j.Log), j.ChunkCount)
	}
}

// TestFailover deletes the leader's pod at once (grace period 0, as a crash would) while
// twenty jobs run: the standby replica takes the lease over, and every job finishes exactly
// once, with its whole log.
func TestFailover(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "the operator runs in the cluster")
	runThroughDisruption(t, e, "e2e-failover", func(ctx context.Context) {
		t0 := time.Now()
		old, err := e.Release.KillLeader(ctx)
		require.NoError(t, err)
		leader, err := e.Release.WaitNewLeader(ctx, old)
		require.NoError(t, err, "the operator's log:\n%s", e.Operator.Tail(40))
		recordTiming("failover: leader %s deleted, %s took over after %s", old, leader, time.Since(t0).Round(10*time.Millisecond))
	})
}

// TestUpgrade upgrades the release to a new image tag while twenty jobs run: the replicas are
// replaced one by one, and every job finishes exactly once, with its whole log.
func TestUpgrade(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "the operator runs in the cluster")
	require.NotNil(t, e.Node, "the new tag is imported into the local node")
	ctx := context.Background()
	const newTag = "upgrade"
	tar, err := images.Retag(filepath.Join(testkit.RepoRoot(), ".cache", "images", images.TarName(images.AgentdImage)),
		images.AgentdImage, "bk-operator/agentd:"+newTag, t.TempDir())
	require.NoError(t, err)
	require.NoError(t, e.Node.ImportImage(ctx, tar))
	runThroughDisruption(t, e, "e2e-upgrade", func(ctx context.Context) {
		t0 := time.Now()
		require.NoError(t, e.Release.Upgrade(ctx, "--set", "image.tag="+newTag))
		recordTiming("upgrade: helm upgrade to a new image tag rolled out in %s", time.Since(t0).Round(10*time.Millisecond))
		pods, err := e.Release.Pods(ctx)
		require.NoError(t, err)
		for _, p := range pods {
			if p.DeletionTimestamp == nil {
				assert.Equal(t, "bk-operator/agentd:"+newTag, p.Spec.Containers[0].Image, "pod %s", p.Name)
			}
		}
	})
	// Back to the suite's image for the tests that follow.
	require.NoError(t, e.Release.Upgrade(ctx))
	require.NoError(t, e.WaitAgents(ctx, spawn, 2*time.Minute))
}

// runThroughDisruption runs twenty jobs, disrupts the operator once all of them are running,
// and audits them (harness.AuditJobs, the soak's measures): each finished once, accepted
// once, with exit status 0 and both of its numbered lines, in order.
func runThroughDisruption(t *testing.T, e *harness.Env, pipeline string, disrupt func(context.Context)) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline:     pipeline,
		PipelineYAML: "steps:\n" + harness.NumberedStep("numbered", 2, 25*time.Second, fmt.Sprintf("parallelism: %d", n)),
	})
	require.NoError(t, err)
	require.Len(t, b.Jobs, n)
	for _, id := range b.Jobs {
		_, err := e.Fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool {
			return strings.Contains(fakebuildkite.PlainLog(j.Log), "numbered line 1 of 2") || fakebuildkite.IsTerminal(j.State)
		})
		require.NoError(t, err, "job %s never printed its first line; the operator's log:\n%s", id, e.Operator.Tail(30))
	}
	disrupt(ctx)
	jobs, err := e.WaitBuild(ctx, b.ID, 0, nil)
	require.NoError(t, err, "the operator's log:\n%s", e.Operator.Tail(40))
	require.Len(t, jobs, n)
	a := harness.AuditJobs(jobs, func(string) harness.Expect { return harness.Expect{Lines: 2, Bound: 6 * time.Minute} })
	assert.False(t, a.Failed(), "%s", a)
	assert.Empty(t, a.Reaccepted, "every job is accepted once: %s", a)
	assert.Empty(t, a.FailedUndisturbed, "every job passes: %s", a)
	assert.Zero(t, a.RefusedFinishes, "no job is finished twice: %s", a)
	// The leader takes jobs again.
	require.NoError(t, e.WaitAgents(ctx, spawn, 2*time.Minute))
}

// TestTwentyJobs runs twenty jobs at once. Each job marks itself in a folder all of them
// share and waits until twenty marks are there: they pass only if all ran at the same time.
func TestTwentyJobs(t *testing.T) {
	e := needEnv(t)
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	shared := hostDir(t)
	require.NoError(t, harness.GiveToPods(shared))
	be := hostPathEnvironment("barrier", shared, corev1.VolumeMount{Name: "barrier", MountPath: "/barrier"})
	be.Spec.Runner = bkv1.RunnerCommand // the fake's build has no repository to check out
	require.NoError(t, e.ApplyEnvironment(ctx, be))

	start := time.Now()
	b, err := e.Fake.CreateBuild(fakebuildkite.BuildRequest{
		Pipeline: "e2e-twenty",
		PipelineYAML: fmt.Sprintf(`agents:
  queue: bk-operator
steps:
  - command: |
      touch /barrier/$BUILDKITE_JOB_ID
      i=0
      while [ "$(ls /barrier | wc -l)" -lt %[1]d ]; do
        i=$((i+1)); [ $i -lt 240 ] || { echo "only $(ls /barrier | wc -l) jobs ran at once"; exit 1; }
        sleep 0.5
      done
      echo "job $BUILDKITE_PARALLEL_JOB saw all %[1]d jobs running"
    parallelism: %[1]d
    env:
      BK_OPERATOR_BUILD_ENVIRONMENT: barrier
`, n),
	})
	require.NoError(t, err)
	require.Len(t, b.Jobs, n)
	jobs, err := e.WaitBuild(ctx, b.ID, 0, nil)
	require.NoError(t, err)
	recordTiming("%d jobs at once finished after %s", n, time.Since(start).Round(10*time.Millisecond))
	require.Len(t, jobs, n)
	for _, j := range jobs {
		log := fakebuildkite.PlainLog(j.Log)
		assert.Equal(t, fakebuildkite.StateFinished, j.State, "job %s", j.ID)
		assert.Equal(t, "0", j.ExitStatus, "job %s; log:\n%s", j.ID, log)
		assert.Equal(t, 1, j.FinishCount, "job %s", j.ID)
		assert.Contains(t, log, fmt.Sprintf("job %d saw all %d jobs running", j.ParallelJob, n))
	}
}
