package fakebuildkite

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// These tests run the real buildkite-agent (the Makefile's AGENT_VERSION, v3.138.1) against
// the fake: they are what shows the fake speaks the protocol as Buildkite does.

// gitRepo makes a local git repository with the given files committed and returns its path
// and the commit SHA.
func gitRepo(t *testing.T, files map[string]string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(hermeticEnv(t.TempDir()), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
		return strings.TrimSpace(string(out))
	}
	git("init", "-q", "-b", "main")
	if len(files) == 0 {
		files = map[string]string{"README": "test repo\n"}
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	git("add", "-A")
	git("commit", "-q", "-m", "test commit")
	return dir, git("rev-parse", "HEAD")
}

// hermeticEnv is the environment for child processes: no BUILDKITE_* from the test's own
// environment (the agent reads its flags from those), a private HOME, and no git config.
func hermeticEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BUILDKITE") || strings.HasPrefix(k, "GIT_") || k == "HOME" || k == "CI" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")
}

type realAgent struct {
	cmd  *exec.Cmd
	out  *testkit.SyncBuffer
	done chan struct{}
	err  error
}

// startAgent runs `buildkite-agent start` against the fake with every path in a temp dir.
func startAgent(t *testing.T, s *Server, name string, tags []string, extra ...string) *realAgent {
	t.Helper()
	// Missing is a failure, not a skip: without the real agent the fake is unproven.
	bin := testkit.RequireAgent(t)
	root := t.TempDir()
	for _, d := range []string{"builds", "hooks", "plugins", "home"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	// bootstrap (v3.138) serves the Job API on a unix socket under the sockets path, whose
	// whole path may be at most 108 bytes: t.TempDir(), named after the test, may be longer.
	sockets, err := os.MkdirTemp("", "bk-sockets-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(sockets) })
	cfg := filepath.Join(root, "buildkite-agent.cfg")
	require.NoError(t, os.WriteFile(cfg, nil, 0o644))
	args := []string{"start",
		"--config", cfg,
		"--token", s.RegistrationToken(),
		"--endpoint", s.Endpoint(),
		"--name", name,
		"--tags", strings.Join(tags, ","),
		"--build-path", filepath.Join(root, "builds"),
		"--hooks-path", filepath.Join(root, "hooks"),
		"--plugins-path", filepath.Join(root, "plugins"),
		"--sockets-path", sockets,
		"--no-color", "--no-pty", "--no-ansi-timestamps",
		"--no-ssh-keyscan", "--no-git-submodules", "--no-feature-reporting",
		"--cancel-grace-period", "3",
	}
	args = append(args, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = hermeticEnv(filepath.Join(root, "home"))
	a := &realAgent{cmd: cmd, out: &testkit.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = a.out, a.out
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	go func() {
		a.err = cmd.Wait()
		close(a.done)
	}()
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			_ = cmd.Process.Signal(os.Interrupt)
			select {
			case <-a.done:
			case <-time.After(10 * time.Second):
				cancel()
				<-a.done
			}
		}
		cancel()
		if t.Failed() {
			t.Logf("buildkite-agent output:\n%s", a.out.String())
		}
	})
	return a
}

// wait waits for the agent to exit on its own (e.g. --disconnect-after-job) and checks it
// exited cleanly.
func (a *realAgent) wait(t *testing.T) {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("buildkite-agent did not exit; output:\n%s", a.out.String())
	}
	require.NoError(t, a.err, "buildkite-agent exit; output:\n%s", a.out.String())
}

func endpointsOf(reqs []Request) []string {
	var out []string
	for _, r := range reqs {
		if len(out) == 0 || out[len(out)-1] != r.Endpoint {
			out = append(out, r.Endpoint)
		}
	}
	return out
}

// indexOf returns the position of want in have, or -1.
func indexOf(have []string, want string) int {
	for i, h := range have {
		if h == want {
			return i
		}
	}
	return -1
}

func TestRealAgentRunsCommandStep(t *testing.T) {
	// The expected output: tabs, unicode, long lines, and enough of it (with small chunks) that
	// the agent's three upload workers send many chunks, in whatever order they finish.
	var want bytes.Buffer
	for i := range 400 {
		fmt.Fprintf(&want, "line %03d\tünïcødé ✓ %s\n", i, strings.Repeat("x", i%50))
	}
	tests := []struct {
		name     string
		command  string
		wantExit string
	}{
		{"passing step", "cat expected.txt", "0"},
		{"step that exits 3", "cat expected.txt; exit 3", "3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Without the streaming ping, as Buildkite where it does not offer it: the agent
			// falls back to polling (TestRealAgentStreaming has the stream).
			s := startFake(t, Options{ChunksMaxSizeBytes: 2048, NoStreaming: true})
			repo, sha := gitRepo(t, map[string]string{"expected.txt": want.String()})
			b, err := s.CreateBuild(BuildRequest{
				PipelineYAML: fmt.Sprintf("steps:\n  - command: %q\n    label: real\n    agents: {queue: real-agent, cluster: test}\n", tt.command),
				Repo:         repo, Commit: sha, Branch: "main",
			})
			require.NoError(t, err)
			agent := startAgent(t, s, "real-1", []string{"queue=real-agent", "cluster=test", "extra=1"}, "--disconnect-after-job")
			agent.wait(t)

			j, ok := s.Job(b.Jobs[0])
			require.True(t, ok)
			assert.Equal(t, StateFinished, j.State)
			assert.Equal(t, tt.wantExit, j.ExitStatus)
			assert.Empty(t, j.SignalReason)
			assert.Equal(t, 1, j.FinishCount)
			assert.Equal(t, 1, j.StartCount)
			assert.Equal(t, 0, j.ChunksFailedCount)
			assert.Greater(t, j.ChunkCount, 5, "a long log arrives in many chunks")
			assert.True(t, bytes.Contains(j.Log, want.Bytes()), "the log holds the command's output byte for byte")
			assert.Contains(t, string(j.Log), "Preparing working directory", "the bootstrap ran")
			assert.Contains(t, string(j.Log), sha, "the bootstrap checked out the local repository")

			agents := s.Agents()
			require.Len(t, agents, 1)
			assert.Equal(t, "real-1", agents[0].Name)
			assert.ElementsMatch(t, []string{"queue=real-agent", "cluster=test", "extra=1"}, agents[0].Tags)
			assert.Equal(t, agents[0].ID, j.AcceptedBy)
			assert.Equal(t, AgentDisconnected, agents[0].State)
			assert.Equal(t, "real-agent", j.Env["BUILDKITE_AGENT_META_DATA_QUEUE"])

			// The order of calls a real agent makes, as Buildkite sees them: it tries the
			// streaming ping first (--ping-mode auto), which this fake does not offer, and
			// polls from then on, never trying the stream again.
			eps := endpointsOf(s.Requests())
			require.GreaterOrEqual(t, len(eps), 7, "%v", eps)
			assert.Equal(t, []string{EPRegister, EPConnect, EPStreamPings, EPPing, EPAccept, EPStart}, eps[:6])
			assert.Equal(t, 1, s.RequestCount(EPStreamPings, ""))
			assert.Contains(t, agent.out.String(), "permanently falling back to polling-based ping mode")
			assert.Equal(t, []string{ViaPing}, j.OfferedVia, "the job was handed out by a ping")
			assert.Equal(t, ViaPing, j.AcceptedVia)
			assert.Less(t, indexOf(eps, EPChunks), indexOf(eps, EPFinish), "logs are sent before finish: %v", eps)
			assert.Equal(t, EPDisconnect, eps[len(eps)-1])
			for _, r := range s.Requests() {
				assert.Less(t, r.Status, 400, "%s %s got %d", r.Method, r.Path, r.Status)
			}
			b2, _ := s.Build(b.ID)
			assert.Contains(t, b2.MetaData["buildkite:git:commit"], sha, "the bootstrap records the commit as meta-data")
		})
	}
}

func TestRealAgentCancel(t *testing.T) {
	t.Parallel()
	s := startFake(t, Options{})
	repo, sha := gitRepo(t, nil)
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: echo started; sleep 60; echo not-reached\n", Repo: repo, Commit: sha})
	require.NoError(t, err)
	agent := startAgent(t, s, "cancel-1", []string{"queue=default"}, "--disconnect-after-job")
	waitJob(t, s, b.Jobs[0], func(j JobSnapshot) bool { return strings.Contains(string(j.Log), "started\n") })
	require.NoError(t, s.CancelJob(b.Jobs[0]))
	canceledAt := time.Now()
	j := waitJob(t, s, b.Jobs[0], func(j JobSnapshot) bool { return IsTerminal(j.State) })
	assert.Less(t, time.Since(canceledAt), 20*time.Second)
	assert.Equal(t, StateCanceled, j.State)
	assert.Equal(t, "cancel", j.SignalReason)
	// v3.138 sends "-1" for a job it cancelled.
	assert.Equal(t, "-1", j.ExitStatus)
	assert.NotContains(t, string(j.Log), "\nnot-reached\n", "the command was stopped")
	assert.Equal(t, 1, j.FinishCount)
	agent.wait(t)
}

func TestRealAgentRetriesAfter422OnAccept(t *testing.T) {
	t.Parallel()
	// Polling: after a refused accept a polling agent pings again, where a streaming one
	// waits for Buildkite to push a job.
	s := startFake(t, Options{NoStreaming: true})
	repo, sha := gitRepo(t, nil)
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: echo first\n  - command: echo second\n", Repo: repo, Commit: sha})
	require.NoError(t, err)
	s.Inject(Fault{Endpoint: EPAccept, JobID: b.Jobs[0], Status: 422, Message: "Job has already been accepted by another agent", Times: 1})
	agent := startAgent(t, s, "retry-1", []string{"queue=default"})

	for _, id := range b.Jobs {
		j := waitJob(t, s, id, func(j JobSnapshot) bool { return IsTerminal(j.State) })
		assert.Equal(t, StateFinished, j.State)
		assert.Equal(t, "0", j.ExitStatus)
	}
	agents := s.Agents()
	require.Len(t, agents, 1)
	require.NoError(t, s.SetAgentAction(agents[0].ID, ActionDisconnect))
	agent.wait(t)

	// The agent got a 422, went back to pinging, then accepted the job, then took the next one.
	var seq []string
	for _, r := range s.Requests() {
		if r.Endpoint != EPAccept && r.Endpoint != EPPing {
			continue
		}
		e := fmt.Sprintf("%s %d", r.Endpoint, r.Status)
		if len(seq) == 0 || seq[len(seq)-1] != e {
			seq = append(seq, e)
		}
	}
	require.GreaterOrEqual(t, len(seq), 6, "%v", seq)
	assert.Equal(t, []string{"ping 200", "accept 422", "ping 200", "accept 200", "ping 200", "accept 200"}, seq[:6])
	first, _ := s.Job(b.Jobs[0])
	second, _ := s.Job(b.Jobs[1])
	assert.Equal(t, 1, first.AcceptCount)
	assert.True(t, second.AcceptedAt.After(first.FinishedAt), "the second job came after the first")
	assert.Contains(t, string(first.Log), "first")
	assert.Contains(t, string(second.Log), "second")
}

func TestRealAgentMetaData(t *testing.T) {
	t.Parallel()
	s := startFake(t, Options{})
	repo, sha := gitRepo(t, nil)
	cmd := `buildkite-agent meta-data set greeting "hello meta" && ` +
		`got="$(buildkite-agent meta-data get greeting)" && echo "got=[$got]" && ` +
		`buildkite-agent meta-data exists greeting && ` +
		`if buildkite-agent meta-data get nope; then exit 9; fi && ` +
		`echo "default=[$(buildkite-agent meta-data get nope --default fallback)]"`
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: fmt.Sprintf("steps:\n  - command: %q\n", cmd), Repo: repo, Commit: sha})
	require.NoError(t, err)
	startAgent(t, s, "meta-1", []string{"queue=default"}, "--disconnect-after-job").wait(t)
	j, _ := s.Job(b.Jobs[0])
	assert.Equal(t, "0", j.ExitStatus, "log:\n%s", j.Log)
	assert.Contains(t, string(j.Log), "got=[hello meta]")
	assert.Contains(t, string(j.Log), "default=[fallback]")
	build, _ := s.Build(b.ID)
	assert.Equal(t, "hello meta", build.MetaData["greeting"])
	assert.Positive(t, s.RequestCount(EPMetaData, j.ID))
}

func TestRealAgentPipelineUpload(t *testing.T) {
	t.Parallel()
	s := startFake(t, Options{})
	repo, sha := gitRepo(t, map[string]string{".buildkite/more.yml": "env:\n  UPLOADED: \"yes\"\nsteps:\n  - label: uploaded\n    key: up\n    command: echo uploaded\n    agents: {queue: elsewhere}\n    plugins:\n      - docker#v5.12.0: {image: alpine}\n  - wait\n  - command: echo two\n    parallelism: 2\n"})
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: buildkite-agent pipeline upload .buildkite/more.yml\n", Repo: repo, Commit: sha})
	require.NoError(t, err)
	startAgent(t, s, "upload-1", []string{"queue=default"}, "--disconnect-after-job").wait(t)
	j, _ := s.Job(b.Jobs[0])
	require.Equal(t, "0", j.ExitStatus, "log:\n%s", j.Log)

	build, _ := s.Build(b.ID)
	require.Len(t, build.Jobs, 4, "the uploaded steps became jobs of the build")
	up, _ := s.Job(build.Jobs[1])
	assert.Equal(t, "up", up.StepKey)
	assert.Equal(t, "uploaded", up.Label)
	assert.Equal(t, j.ID, up.UploadedFromJob)
	assert.Equal(t, []string{"queue=elsewhere"}, up.AgentQueryRules)
	assert.Equal(t, StateScheduled, up.State)
	assert.Equal(t, "yes", up.Env["UPLOADED"])
	assert.Equal(t, `[{"github.com/buildkite-plugins/docker-buildkite-plugin#v5.12.0":{"image":"alpine"}}]`, up.Env["BUILDKITE_PLUGINS"])
	two, _ := s.Job(build.Jobs[3])
	assert.Equal(t, "1", two.Env["BUILDKITE_PARALLEL_JOB"])
	assert.Equal(t, 1, s.RequestCount(EPPipelineUpload, j.ID))
	assert.Positive(t, s.RequestCount(EPPipelineStatus, j.ID))
}

func TestRealAgentArtifactUpload(t *testing.T) {
	t.Parallel()
	s := startFake(t, Options{})
	repo, sha := gitRepo(t, nil)
	cmd := `mkdir -p out && printf 'artifact\tcontent ✓\n' > out/result.txt && buildkite-agent artifact upload 'out/*.txt' && ` +
		`mkdir -p dl && buildkite-agent artifact download out/result.txt dl && cat dl/out/result.txt`
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: fmt.Sprintf("steps:\n  - command: %q\n", cmd), Repo: repo, Commit: sha})
	require.NoError(t, err)
	startAgent(t, s, "artifact-1", []string{"queue=default"}, "--disconnect-after-job").wait(t)
	j, _ := s.Job(b.Jobs[0])
	require.Equal(t, "0", j.ExitStatus, "log:\n%s", j.Log)
	arts := s.Artifacts(j.ID)
	require.Len(t, arts, 1)
	assert.Equal(t, "out/result.txt", arts[0].Path)
	assert.Equal(t, "finished", arts[0].State)
	assert.Equal(t, "artifact\tcontent ✓\n", string(arts[0].Content))
	assert.Equal(t, int64(len(arts[0].Content)), arts[0].FileSize)
	assert.NotEmpty(t, arts[0].Sha1Sum)
	// The download (search, then GET of the artifact's URL) printed the content into the log.
	assert.Contains(t, string(j.Log), "artifact\tcontent ✓\n")
}

// TestRealAgentSecretsOIDCAndRedactor runs, on the real agent, what reads a pipeline's
// secrets and OIDC tokens: a step's `secrets:` (the agent passes them to bootstrap as
// BUILDKITE_SECRETS_CONFIG, and bootstrap fetches them into the job's env), `secret get`,
// `oidc request-token`, and `redactor add`. Each value is printed to the log, where it must
// show as [REDACTED]; the job also writes what the commands printed to files, which show
// the values themselves reached the job.
func TestRealAgentSecretsOIDCAndRedactor(t *testing.T) {
	t.Parallel()
	s := startFake(t, Options{})
	repo, sha := gitRepo(t, nil)
	const deployKey, apiToken = "deploy-value-9f3a", "api-value-c41e"
	require.NoError(t, s.SetSecret("org", "pipeline", "DEPLOY_KEY", deployKey))
	require.NoError(t, s.SetSecret("org", "pipeline", "API_TOKEN", apiToken))
	out := t.TempDir()
	// No value is in the command itself, which bootstrap prints before it runs.
	cmd := fmt.Sprintf(`set -e; out=%q
buildkite-agent secret get api_token > "$out/secret"; echo "secret=[$(cat "$out/secret")]"
buildkite-agent oidc request-token --audience sts.example.invalid --lifetime 120 > "$out/oidc"; echo "oidc=[$(cat "$out/oidc")]"
echo "env=[$DEPLOY_KEY]"
later="runtime-$((4700 + 11))"; echo "$later" | buildkite-agent redactor add; echo "added=[$later]"`, out)
	b, err := s.CreateBuild(BuildRequest{
		PipelineYAML: fmt.Sprintf("steps:\n  - command: %q\n    secrets: [DEPLOY_KEY]\n", cmd),
		Repo:         repo, Commit: sha,
	})
	require.NoError(t, err)
	startAgent(t, s, "secrets-1", []string{"queue=default"}, "--disconnect-after-job").wait(t)
	j, _ := s.Job(b.Jobs[0])
	log := PlainLog(j.Log)
	require.Equal(t, "0", j.ExitStatus, "log:\n%s", log)

	secret, err := os.ReadFile(filepath.Join(out, "secret"))
	require.NoError(t, err)
	assert.Equal(t, apiToken+"\n", string(secret), "secret get prints the value")
	token, err := os.ReadFile(filepath.Join(out, "oidc"))
	require.NoError(t, err)
	claims, err := s.VerifyOIDCToken(strings.TrimSpace(string(token)))
	require.NoError(t, err, "oidc request-token prints the fake's token")
	assert.Equal(t, "sts.example.invalid", claims["aud"])
	assert.Equal(t, j.ID, claims["job_id"])
	assert.Equal(t, []OIDCTokenRequest{{JobID: j.ID, Audience: "sts.example.invalid", Lifetime: 120}}, s.OIDCTokenRequests(j.ID))
	assert.Equal(t, 2, s.RequestCount(EPSecrets, j.ID), "bootstrap's fetch of DEPLOY_KEY and secret get's of API_TOKEN")

	assert.Contains(t, log, "Secret DEPLOY_KEY added as environment variable DEPLOY_KEY")
	for _, line := range []string{"secret=[[REDACTED]]", "oidc=[[REDACTED]]", "env=[[REDACTED]]", "added=[[REDACTED]]"} {
		assert.Contains(t, log, line)
	}
	for _, value := range []string{deployKey, apiToken, strings.TrimSpace(string(token)), "runtime-4711"} {
		assert.NotContains(t, log, value)
	}
}
