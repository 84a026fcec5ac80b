// Package spawner_test runs the JobSpawner as a real process (agentd spawner) against a
// real API server and the fake Buildkite, and kills it with SIGKILL at random moments.
package spawner_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/pkg/spawner/spawnertest"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const regToken = "restart-registration-token"

// buildAgentd builds the daemon once per test run.
func buildAgentd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agentd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/agentd")
	cmd.Dir = testkit.RepoRoot()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building agentd: %s", out)
	return bin
}

type daemon struct {
	t    *testing.T
	args []string
	bin  string
	log  *os.File
	cmd  *exec.Cmd
}

func (d *daemon) start() {
	d.t.Helper()
	d.cmd = exec.Command(d.bin, d.args...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	require.NoError(d.t, d.cmd.Start())
}

func (d *daemon) kill9() {
	d.t.Helper()
	require.NoError(d.t, d.cmd.Process.Signal(syscall.SIGKILL))
	_ = d.cmd.Wait()
}

func (d *daemon) term() error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		return fmt.Errorf("agentd spawner did not stop within 30s of SIGTERM")
	}
}

func TestKillNineAndRestart(t *testing.T) {
	bin := buildAgentd(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "restart-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	require.NoError(t, env.Client.Create(ctx, gen.BuildEnvironment("go", gen.SetBuildEnvironmentNamespace(ns.Name))))

	fake, err := fakebuildkite.Start(fakebuildkite.Options{RegistrationToken: regToken, PingInterval: 1, HeartbeatInterval: 1,
		// It tells idle slots by their pings, which streaming slots do not send.
		NoStreaming: true})
	require.NoError(t, err)
	defer fake.Close()

	rep := &spawnertest.Reporter{Client: env.Client, Namespace: ns.Name, Hold: 1500 * time.Millisecond}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan struct{})
	go func() { defer close(rdone); rep.Run(rctx) }()
	defer func() { rcancel(); <-rdone }()

	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(regToken), 0o600))
	logFile, err := os.Create(filepath.Join(dir, "agentd.log"))
	require.NoError(t, err)
	defer func() {
		_ = logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("agentd log:\n%s", b)
		}
	}()
	const slots = 5
	d := &daemon{t: t, bin: bin, log: logFile, args: []string{"spawner",
		"-kubeconfig", env.KubeconfigPath, "-namespace", ns.Name,
		"-agent-endpoint", fake.Endpoint(), "-spawner-name", "restart",
		"-slots", fmt.Sprint(slots), "-registration-token-file", tokenFile,
		"-api-wait-scale", "0.01", "-create-timeout", "20s",
	}}
	d.start()

	var yaml strings.Builder
	yaml.WriteString("steps:\n")
	for i := range 30 {
		fmt.Fprintf(&yaml, "  - command: echo %d\n    agents: {queue: bk-operator}\n    plugins:\n      - buildkite-operator#v0.1.0: {build_environment: go}\n", i)
	}
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: yaml.String()})
	require.NoError(t, err)

	var lastStart time.Time
	for i := range 5 {
		time.Sleep(time.Duration(300+rand.IntN(2500)) * time.Millisecond)
		d.kill9()
		t.Logf("kill -9 #%d", i+1)
		lastStart = time.Now()
		d.start()
	}

	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, id := range b.Jobs {
		_, err := fake.WaitJob(wctx, id, func(j fakebuildkite.JobSnapshot) bool { return fakebuildkite.IsTerminal(j.State) })
		require.NoError(t, err, "job %s is stuck", id)
	}

	var list v1alpha1.BuildJobList
	require.NoError(t, env.Client.List(ctx, &list, client.InNamespace(ns.Name)))
	perJob := map[string]int{}
	for _, bj := range list.Items {
		perJob[bj.Spec.JobID]++
	}
	for _, id := range b.Jobs {
		j, _ := fake.Job(id)
		assert.Equal(t, 1, j.FinishCount, "finishes of job %s", id)
		assert.Equal(t, "0", j.ExitStatus, "job %s ran (was not failed at intake)", id)
		assert.Equal(t, 1, perJob[id], "BuildJobs of job %s", id)
		assert.Equal(t, 1, j.AcceptCount, "accepts of job %s", id)
	}
	assert.Len(t, list.Items, 30)
	assert.Empty(t, rep.Errors())
	assert.LessOrEqual(t, rep.MaxInFlight(), slots)

	// No registration leaked: at most one connected agent per slot.
	connected := 0
	for _, a := range fake.Agents() {
		if a.Connected {
			connected++
		}
	}
	assert.LessOrEqual(t, connected, slots, "connected agents after five kill -9s")

	// A graceful stop of an idle pool disconnects every agent and removes the slots' state.
	// First let the pool go idle: the last slots free themselves once their BuildJobs are
	// reported, just after the jobs finish in Buildkite.
	// A slot is idle once its agent pings after the end of the last job it took: a slot
	// pings only when it holds no job. (Its Secret does not say: the marker of the last
	// job stays until the next accept.) The pings must come from the last process, which
	// is then up, its SIGTERM handler in place: the jobs may all have ended before it
	// started.
	busySlots := func() []string {
		lastPing := map[string]time.Time{}
		for _, r := range fake.Requests() {
			if r.Endpoint == fakebuildkite.EPPing && r.Time.After(lastStart) && r.Time.After(lastPing[r.AgentID]) {
				lastPing[r.AgentID] = r.Time
			}
		}
		connected := map[string]bool{}
		for _, a := range fake.Agents() {
			connected[a.ID] = a.Connected
		}
		var busy []string
		for _, j := range fake.Jobs() {
			if connected[j.AcceptedBy] && !lastPing[j.AcceptedBy].After(j.FinishedAt) {
				busy = append(busy, j.AcceptedBy)
			}
		}
		for id, up := range connected {
			if up && lastPing[id].IsZero() {
				busy = append(busy, id+" (no ping from the last process yet)")
			}
		}
		return busy
	}
	require.Eventually(t, func() bool { return len(busySlots()) == 0 }, 30*time.Second, 100*time.Millisecond, "slots still busy: %v", busySlots())
	require.NoError(t, d.term())
	for _, a := range fake.Agents() {
		assert.False(t, a.Connected, "agent %s (%s) still connected after SIGTERM", a.Name, a.ID)
	}
	var secrets corev1.SecretList
	require.NoError(t, env.Client.List(ctx, &secrets, client.InNamespace(ns.Name), client.MatchingLabels{spawner.LabelSpawner: "restart"}))
	var left []string // names only: the Secrets hold tokens
	for _, s := range secrets.Items {
		left = append(left, s.Name)
	}
	assert.Empty(t, left, "slot state Secrets after a graceful stop")
}
