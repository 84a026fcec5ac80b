package spawner_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner/spawnertest"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const regToken = "test-registration-token"

// newNamespace makes a namespace of the test's own, with a BuildEnvironment "go".
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "spawner-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	createEnvironment(t, ns.Name, "go")
	return ns.Name
}

func createEnvironment(t *testing.T, ns, name string, mods ...gen.BuildEnvironmentModifier) {
	t.Helper()
	be := gen.BuildEnvironment(name, mods...)
	be.Namespace = ns
	require.NoError(t, env.Client.Create(context.Background(), be))
}

func startFake(t *testing.T) *fakebuildkite.Server {
	t.Helper()
	fake, err := fakebuildkite.Start(fakebuildkite.Options{RegistrationToken: regToken, PingInterval: 1, HeartbeatInterval: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	return fake
}

type running struct {
	sp     *spawner.Spawner
	cancel context.CancelFunc
	done   chan struct{}
}

// stop stops the spawner as SIGTERM would, and waits for it, as agentd does.
func (r *running) stop() {
	r.cancel()
	<-r.done
	r.sp.StopHeartbeats()
}

// startSpawner runs a spawner over a cache of ns, as the manager would.
func startSpawner(t *testing.T, fake *fakebuildkite.Server, ns string, edit func(*spawner.Config)) *running {
	t.Helper()
	return startSpawnerWith(t, fake, ns, env.Client, edit)
}

// startSpawnerWith is startSpawner with the client the spawner writes with.
func startSpawnerWith(t *testing.T, fake *fakebuildkite.Server, ns string, cl client.Client, edit func(*spawner.Config)) *running {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(regToken+"\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	cfg := spawner.Config{
		Name:                  "bk-operator-test",
		Namespace:             ns,
		Endpoint:              fake.Endpoint(),
		Slots:                 3,
		RegistrationTokenFile: tokenFile,
		CreateTimeout:         5 * time.Second,
		APIReader:             env.Client,
		APIWaitScale:          0.01,
		Log:                   testr.NewWithOptions(t, testr.Options{Verbosity: 0}),
	}
	if edit != nil {
		edit(&cfg)
	}
	if cfg.Cache == nil {
		c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
		require.NoError(t, err)
		go func() { _ = c.Start(ctx) }()
		cfg.Cache = c
	}
	sp, err := spawner.New(cfg, cl)
	require.NoError(t, err)
	r := &running{sp: sp, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		assert.NoError(t, sp.Start(ctx))
	}()
	t.Cleanup(r.stop)
	return r
}

func startReporter(t *testing.T, ns string, hold time.Duration) *spawnertest.Reporter {
	t.Helper()
	r := &spawnertest.Reporter{Client: env.Client, Namespace: ns, Hold: hold}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// pipeline is a pipeline of n steps for the operator's queue, with extra step YAML.
func pipeline(n int, extra string) string {
	var b strings.Builder
	b.WriteString("steps:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - label: step %d\n    command: echo %d\n    agents: {queue: bk-operator}\n", i, i)
		if extra != "" {
			b.WriteString(extra)
		}
	}
	return b.String()
}

const goPlugin = "    plugins:\n      - buildkite-operator#v0.1.0:\n          build_environment: go\n"

func waitJobsFinished(t *testing.T, fake *fakebuildkite.Server, ids []string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, id := range ids {
		_, err := fake.WaitJob(ctx, id, func(j fakebuildkite.JobSnapshot) bool { return j.State == fakebuildkite.StateFinished })
		require.NoError(t, err, "job %s never finished", id)
	}
}

func buildJobs(t *testing.T, ns string) map[string]v1alpha1.BuildJob {
	t.Helper()
	var list v1alpha1.BuildJobList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	out := map[string]v1alpha1.BuildJob{}
	for _, bj := range list.Items {
		out[bj.Spec.JobID] = bj
	}
	return out
}

// connectedAgents counts the fake's connected agents whose name starts with prefix.
func connectedAgents(fake *fakebuildkite.Server, prefix string) int {
	n := 0
	for _, a := range fake.Agents() {
		if a.Connected && strings.HasPrefix(a.Name, prefix) {
			n++
		}
	}
	return n
}

func TestFiftyJobsTenSlots(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	rep := startReporter(t, ns, 300*time.Millisecond)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 10 })

	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(50, goPlugin)})
	require.NoError(t, err)
	require.Len(t, b.Jobs, 50)

	// Sample Buildkite's view while the jobs run: never more than 10 agents hold a job.
	var mu sync.Mutex
	maxHolding := 0
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			held := 0
			for _, a := range fake.Agents() {
				if a.CurrentJob != "" {
					if j, ok := fake.Job(a.CurrentJob); ok && !fakebuildkite.IsTerminal(j.State) {
						held++
					}
				}
			}
			mu.Lock()
			maxHolding = max(maxHolding, held)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	waitJobsFinished(t, fake, b.Jobs, 90*time.Second)
	close(stop)
	<-sampled

	bjs := buildJobs(t, ns)
	for _, id := range b.Jobs {
		j, _ := fake.Job(id)
		assert.Equal(t, 1, j.FinishCount, "job %s finishes", id)
		assert.Equal(t, 1, j.AcceptCount, "job %s accepts", id)
		assert.Equal(t, "0", j.ExitStatus, "job %s", id)
		bj, ok := bjs[id]
		if assert.True(t, ok, "job %s has a BuildJob", id) {
			assert.Equal(t, id, bj.Name)
			assert.Equal(t, "go", bj.Spec.BuildEnvironment)
			assert.Equal(t, "app", bj.Labels[v1alpha1.LabelPipeline])
			_, err := time.Parse(time.RFC3339Nano, bj.Annotations[v1alpha1.AnnotationAcceptedAt])
			assert.NoError(t, err, "when the job was accepted, for the controller to record")
		}
	}
	assert.Len(t, bjs, 50, "one BuildJob per job")
	assert.Empty(t, rep.Errors())
	assert.LessOrEqual(t, rep.MaxInFlight(), 10, "BuildJobs in flight")
	assert.Greater(t, rep.MaxInFlight(), 1, "jobs ran in parallel")
	mu.Lock()
	assert.LessOrEqual(t, maxHolding, 10, "agents holding a job")
	mu.Unlock()
	assert.Equal(t, 10, connectedAgents(fake, "bk-operator-test-"), "one registration per slot")
}

func TestBuildJobSpec(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 1 })
	yaml := `steps:
  - label: ":go: test"
    key: unit
    command: make test
    timeout_in_minutes: 30
    agents: {queue: bk-operator}
    env: {FOO: bar}
    plugins:
      - my-org/buildkite-operator#v1.0.0:
          build_environment: go
          log_paths: [/workspace/a.log]
          resources: {requests: {cpu: 500m, memory: 1Gi}}
      - docker#v5.12.0: {image: alpine}
`
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: yaml})
	require.NoError(t, err)
	waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
	bj := buildJobs(t, ns)[b.Jobs[0]]
	s := bj.Spec
	assert.Equal(t, "app", s.PipelineSlug)
	assert.Equal(t, int64(b.Number), s.BuildNumber)
	assert.Equal(t, b.ID, s.BuildID)
	assert.Equal(t, b.URL, s.BuildURL)
	assert.Equal(t, "unit", s.StepKey)
	assert.Equal(t, ":go: test", s.Label)
	assert.Equal(t, "make test", s.Command)
	assert.Equal(t, map[string]string{"queue": "bk-operator"}, s.AgentTags)
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: s.TokenSecretRef.Name}, &sec))
	jobEnv := func(name string) string { return string(sec.Data[v1alpha1.EnvSecretKey(name)]) }
	assert.Empty(t, s.Env, "the job's env is in the Secret")
	assert.Contains(t, s.EnvNames, "FOO")
	assert.Equal(t, "bar", jobEnv("FOO"))
	assert.NotContains(t, s.EnvNames, "BUILDKITE_AGENT_ACCESS_TOKEN")
	assert.NotContains(t, sec.Data, v1alpha1.EnvSecretKey("BUILDKITE_AGENT_ACCESS_TOKEN"))
	assert.NotContains(t, jobEnv("BUILDKITE_PLUGINS"), "buildkite-operator")
	assert.Contains(t, jobEnv("BUILDKITE_PLUGINS"), "docker-buildkite-plugin")
	assert.Equal(t, []string{"/workspace/a.log"}, s.LogPaths)
	require.NotNil(t, s.TimeoutMinutes)
	assert.Equal(t, int32(30), *s.TimeoutMinutes)
	require.NotNil(t, s.Resources)
	assert.Equal(t, "500m", s.Resources.Requests.Cpu().String())
	assert.Equal(t, fake.Endpoint(), s.AgentEndpoint)
	assert.Equal(t, int64(102400), s.LogLimits.ChunksMaxSizeBytes)
	for k, v := range map[string]string{
		v1alpha1.LabelPipeline: "app", v1alpha1.LabelBuild: fmt.Sprint(b.Number),
		v1alpha1.LabelStep: "unit", v1alpha1.LabelJob: b.Jobs[0],
	} {
		assert.Equal(t, v, bj.Labels[k], k)
	}

	assert.True(t, strings.HasPrefix(string(sec.Data[s.TokenSecretRef.Key]), "bkaj_"), "the job token")
	require.Len(t, sec.OwnerReferences, 1)
	assert.Equal(t, bj.UID, sec.OwnerReferences[0].UID)
}

func TestTagRouting(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 100*time.Millisecond)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Name, c.Tags, c.Slots = "op-a", []string{"cluster=a"}, 2 })
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Name, c.Tags, c.Slots = "op-b", []string{"cluster=b"}, 2 })

	var yaml strings.Builder
	yaml.WriteString("steps:\n")
	for i := range 6 {
		cluster := []string{"a", "b"}[i%2]
		fmt.Fprintf(&yaml, "  - command: echo %d\n    agents: {queue: bk-operator, cluster: %s}\n    env: {WANT: %s}\n%s", i, cluster, cluster, goPlugin)
	}
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: yaml.String()})
	require.NoError(t, err)
	waitJobsFinished(t, fake, b.Jobs, 60*time.Second)
	names := map[string]string{}
	for _, a := range fake.Agents() {
		names[a.ID] = a.Name
	}
	for _, id := range b.Jobs {
		j, _ := fake.Job(id)
		want := j.Env["WANT"]
		assert.True(t, strings.HasPrefix(names[j.AcceptedBy], "op-"+want+"-"), "job for cluster=%s accepted by %s", want, names[j.AcceptedBy])
		assert.Equal(t, 1, j.FinishCount)
	}
}

func TestIntakeFailures(t *testing.T) {
	ns := newNamespace(t)
	createEnvironment(t, ns, "restricted", gen.SetBuildEnvironmentAllowedPipelines("other-*"))
	createEnvironment(t, ns, "command-only", gen.SetBuildEnvironmentRunner(v1alpha1.RunnerCommand))
	fake := startFake(t)
	startReporter(t, ns, 0)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 2 })

	cases := []struct {
		name, pipeline, yaml string
		want                 []string
	}{{
		name:     "invalid options",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    plugins:\n      - buildkite-operator#v0.1.0: {build_environment: go, log_path: [/a]}\n",
		want:     []string{"options are invalid", "log_path"},
	}, {
		name:     "unknown environment",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_BUILD_ENVIRONMENT: nope}\n",
		want:     []string{`BuildEnvironment "nope" does not exist.`},
	}, {
		name:     "environment not allowed for the pipeline",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    plugins:\n      - buildkite-operator#v0.1.0: {build_environment: restricted}\n",
		want:     []string{`pipeline "app" may not use BuildEnvironment "restricted"`},
	}, {
		name:     "no environment at all",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    agents: {queue: bk-operator}\n",
		want:     []string{"name the BuildEnvironment the job runs in"},
	}, {
		name:     "plugins under the Command runner",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_BUILD_ENVIRONMENT: command-only}\n    plugins:\n      - docker#v5.12.0: {image: node}\n",
		want:     []string{`BuildEnvironment "command-only" runs only the step's command (runner Command), without the step's plugins; choose an environment whose runner is Bootstrap`},
	}, {
		name:     "artifact_paths under the Command runner",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_BUILD_ENVIRONMENT: command-only}\n    artifact_paths: dist/*\n",
		want:     []string{`BuildEnvironment "command-only" runs only the step's command (runner Command), without uploading the step's artifact_paths; choose an environment whose runner is Bootstrap`},
	}, {
		name:     "rejected by the API server",
		pipeline: "app",
		yaml:     "steps:\n  - command: x\n    timeout_in_minutes: 20000\n    agents: {queue: bk-operator}\n    env: {BK_OPERATOR_BUILD_ENVIRONMENT: go}\n",
		want:     []string{"the Kubernetes API server refused its BuildJob", "spec.timeoutMinutes", "10080"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: tc.pipeline, PipelineYAML: tc.yaml})
			require.NoError(t, err)
			waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
			// The operator's policy refused the job, as an agent's allowlists refuse one.
			assertEndedAtIntake(t, fake, ns, b.Jobs[0], "agent_refused", tc.want...)
		})
	}
}

// assertFailedAtIntake checks that a job was failed by the spawner for a failure of the
// operator's own: finished once with stack_error, no BuildJob, and a log that explains,
// with want in it and no token.
func assertFailedAtIntake(t *testing.T, fake *fakebuildkite.Server, ns, jobID string, want ...string) {
	t.Helper()
	assertEndedAtIntake(t, fake, ns, jobID, "stack_error", want...)
}

// assertEndedAtIntake checks that a job was ended by the spawner: finished once with -1
// and signalReason, no BuildJob, and a log that explains, with want in it and no token.
func assertEndedAtIntake(t *testing.T, fake *fakebuildkite.Server, ns, jobID, signalReason string, want ...string) {
	t.Helper()
	j, _ := fake.Job(jobID)
	assert.Equal(t, "-1", j.ExitStatus)
	assert.Equal(t, signalReason, j.SignalReason)
	assert.Equal(t, 1, j.FinishCount)
	log := fakebuildkite.PlainLog(j.Log)
	assert.Contains(t, log, spawner.FailurePrefix)
	for _, w := range want {
		assert.Contains(t, log, w)
	}
	assert.NotContains(t, log, "bkaj_", "no token in the log")
	_, has := buildJobs(t, ns)[jobID]
	assert.False(t, has, "no BuildJob for a failed job")
}

func waitFor(t *testing.T, fake *fakebuildkite.Server, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	require.NoError(t, fake.WaitFor(ctx, cond), "waiting for %s", what)
}

// theAgent returns the one connected agent named name.
func theAgent(fake *fakebuildkite.Server, name string) (fakebuildkite.AgentSnapshot, bool) {
	var found []fakebuildkite.AgentSnapshot
	for _, a := range fake.Agents() {
		if a.Connected && a.Name == name {
			found = append(found, a)
		}
	}
	if len(found) != 1 {
		return fakebuildkite.AgentSnapshot{}, false
	}
	return found[0], true
}

// TestAgentLifecycle follows a polling slot's registration through Buildkite's answers to
// its pings; TestStreamLifecycle has the streaming ping's.
func TestAgentLifecycle(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)
	startSpawner(t, fake, ns, func(c *spawner.Config) {
		c.Slots, c.ReregisterAfter, c.PingMode = 1, time.Second, spawner.PingModePingOnly
	})
	const name = "bk-operator-test-0"
	var a1 fakebuildkite.AgentSnapshot
	waitFor(t, fake, 10*time.Second, "the slot's agent", func() (ok bool) { a1, ok = theAgent(fake, name); return ok })
	assert.Contains(t, a1.Tags, "queue=bk-operator")

	// 429 with Retry-After: the next ping waits as long.
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPPing, Status: 429, RetryAfter: 3 * time.Second, AgentID: a1.ID, Times: 1})
	var faulted, next time.Time
	waitFor(t, fake, 15*time.Second, "a ping after the 429", func() bool {
		for _, r := range fake.Requests() {
			if r.Endpoint != fakebuildkite.EPPing || r.AgentID != a1.ID {
				continue
			}
			if r.Faulted {
				faulted = r.Time
			} else if !faulted.IsZero() {
				next = r.Time
				return true
			}
		}
		return false
	})
	assert.GreaterOrEqual(t, next.Sub(faulted), 2900*time.Millisecond, "ping honoured Retry-After")

	// A revoked agent (401) is replaced by a new registration of the same name.
	fake.RevokeAgent(a1.ID)
	var a2 fakebuildkite.AgentSnapshot
	waitFor(t, fake, 20*time.Second, "a new registration after the revoke", func() (ok bool) {
		a2, ok = theAgent(fake, name)
		return ok && a2.ID != a1.ID
	})

	// Paused: the slot keeps pinging but takes nothing.
	require.NoError(t, fake.SetAgentAction(a2.ID, fakebuildkite.ActionPause))
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	pings := func() int { a, _ := fake.Agent(a2.ID); return a.PingCount }
	before := pings()
	time.Sleep(3 * time.Second)
	j, _ := fake.Job(b.Jobs[0])
	assert.Equal(t, fakebuildkite.StateScheduled, j.State, "a paused agent takes no job")
	assert.Greater(t, pings(), before, "a paused agent keeps pinging")
	require.NoError(t, fake.SetAgentAction(a2.ID, fakebuildkite.ActionIdle))
	waitJobsFinished(t, fake, b.Jobs, 20*time.Second)

	// Told to disconnect: the slot disconnects, then registers anew after ReregisterAfter.
	require.NoError(t, fake.SetAgentAction(a2.ID, fakebuildkite.ActionDisconnect))
	waitFor(t, fake, 20*time.Second, "a new registration after the disconnect", func() bool {
		old, _ := fake.Agent(a2.ID)
		a3, ok := theAgent(fake, name)
		return old.State == fakebuildkite.AgentDisconnected && ok && a3.ID != a2.ID
	})
}

func TestGracefulStopLeavesBusySlots(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	edit := func(c *spawner.Config) { c.Slots = 3 }
	first := startSpawner(t, fake, ns, edit)
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	jobID := b.Jobs[0]
	waitFor(t, fake, 20*time.Second, "the BuildJob", func() bool { _, ok := buildJobs(t, ns)[jobID]; return ok })
	waitFor(t, fake, 10*time.Second, "all slots registered", func() bool { return connectedAgents(fake, "bk-operator-test-") == 3 })

	first.stop()
	j, _ := fake.Job(jobID)
	var secrets corev1.SecretList
	require.NoError(t, env.Client.List(context.Background(), &secrets, client.InNamespace(ns), client.MatchingLabels{spawner.LabelSpawner: "bk-operator-test"}))
	var kept []string // names only: the Secrets hold tokens
	for _, s := range secrets.Items {
		// The job, by the marker written before its accept, or whole.
		kept = append(kept, s.Name+" job "+string(s.Data["accepting"])+string(s.Data["job-id"]))
	}
	slot := 0
	for i := range 3 {
		if len(secrets.Items) > 0 && spawner.SlotSecretName("bk-operator-test", i) == secrets.Items[0].Name {
			slot = i
		}
	}
	require.Equal(t, []string{spawner.SlotSecretName("bk-operator-test", slot) + " job " + jobID}, kept, "only the busy slot keeps its state")
	for _, a := range fake.Agents() {
		if a.ID == j.AcceptedBy {
			continue
		}
		assert.Equal(t, fakebuildkite.AgentDisconnected, a.State, "idle agent %s", a.Name)
	}

	// The next instance resumes the busy slot under the same registration.
	startSpawner(t, fake, ns, edit)
	startReporter(t, ns, 0)
	waitJobsFinished(t, fake, b.Jobs, 20*time.Second)
	j, _ = fake.Job(jobID)
	assert.Equal(t, 1, j.FinishCount)
	assert.Equal(t, 1, j.AcceptCount)
	waitFor(t, fake, 10*time.Second, "the resumed pool", func() bool { return connectedAgents(fake, "bk-operator-test-") == 3 })
	resumed, _ := fake.Agent(j.AcceptedBy)
	assert.True(t, resumed.Connected, "the busy slot's registration was resumed, not replaced")
}
