package spawner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// slotSecret reads slot i's state Secret; nil when there is none.
func slotSecret(t *testing.T, ns, name string, i int) *corev1.Secret {
	t.Helper()
	var sec corev1.Secret
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: spawner.SlotSecretName(name, i)}, &sec)
	if err != nil {
		require.NoError(t, client.IgnoreNotFound(err))
		return nil
	}
	return &sec
}

// slotHeld is what slot i's Secret says Buildkite holds it in ("" for nothing).
func slotHeld(t *testing.T, ns, name string, i int) string {
	t.Helper()
	if sec := slotSecret(t, ns, name, i); sec != nil {
		return sec.Annotations[spawner.AnnotationSlotState]
	}
	return ""
}

// slotGauge is the slots gauge of one spawner in one state.
func slotGauge(t *testing.T, name, state string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "buildkite_operator_spawner_slots" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["spawner"] == name && labels["state"] == state {
				return m.GetGauge().GetValue()
			}
		}
	}
	return -1 // not exported
}

// pingModes are the modes the actions are tested in: polling, and the stream (auto) with
// polling only while it is down. Stream-only hears the same actions as auto, but stop.
var pingModes = []string{spawner.PingModePingOnly, spawner.PingModeAuto}

// A paused agent takes no job, keeps its registration, heartbeats and pings (or its
// streaming ping), and takes the job once Buildkite resumes it; its Secret and the slots
// gauge say it is paused meanwhile.
func TestPausedSlotTakesNoJob(t *testing.T) {
	for _, mode := range pingModes {
		t.Run(mode, func(t *testing.T) { testPausedSlotTakesNoJob(t, mode) })
	}
}

func testPausedSlotTakesNoJob(t *testing.T, mode string) {
	name := "bk-pause-" + mode
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)
	sp := startSpawner(t, fake, ns, func(c *spawner.Config) { c.Name, c.Slots, c.PingMode = name, 1, mode })
	var a fakebuildkite.AgentSnapshot
	waitFor(t, fake, 10*time.Second, "the slot's agent", func() (ok bool) { a, ok = theAgent(fake, name+"-0"); return ok })

	require.NoError(t, fake.SendAgentAction(a.ID, fakebuildkite.ActionPause))
	require.Eventually(t, func() bool { return slotHeld(t, ns, name, 0) == spawner.SlotPaused }, 10*time.Second, 50*time.Millisecond,
		"the slot's Secret says it is paused")
	sec := slotSecret(t, ns, name, 0)
	assert.Equal(t, "Paused by the fake's control API", sec.Annotations[spawner.AnnotationSlotStateMessage], "with Buildkite's message")
	_, err := time.Parse(time.RFC3339, sec.Annotations[spawner.AnnotationSlotStateSince])
	assert.NoError(t, err, "and since when")
	assert.Equal(t, 1.0, slotGauge(t, name, "paused"))
	assert.Equal(t, 0.0, slotGauge(t, name, "idle"))

	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	before, _ := fake.Agent(a.ID)
	time.Sleep(3500 * time.Millisecond) // pings come every 1-2 s
	j, _ := fake.Job(b.Jobs[0])
	assert.Equal(t, fakebuildkite.StateScheduled, j.State, "a paused slot takes no job")
	after, _ := fake.Agent(a.ID)
	if mode == spawner.PingModePingOnly {
		assert.Greater(t, after.PingCount, before.PingCount, "it keeps pinging")
		assert.Zero(t, after.StreamsOpened, "and never opens the streaming ping")
	} else {
		assert.True(t, after.Streaming, "its streaming ping stays open")
		assert.Equal(t, before.PingCount, after.PingCount, "and it does not poll")
	}
	assert.True(t, after.LastHeartbeat.After(before.LastHeartbeat), "and heartbeating")
	assert.True(t, after.Connected, "under the same registration")
	assert.NoError(t, sp.sp.ReadyCheck(nil), "a paused slot is registered: ready")

	require.NoError(t, fake.SendAgentAction(a.ID, fakebuildkite.ActionIdle))
	waitJobsFinished(t, fake, b.Jobs, 20*time.Second)
	j, _ = fake.Job(b.Jobs[0])
	assert.Equal(t, a.ID, j.AcceptedBy, "the resumed agent took it")
	assert.Equal(t, map[string]string{spawner.PingModePingOnly: fakebuildkite.ViaPing, spawner.PingModeAuto: fakebuildkite.ViaStream}[mode], j.AcceptedVia)
	assert.Equal(t, 1, j.FinishCount)
	assert.Empty(t, slotHeld(t, ns, name, 0), "the Secret no longer says paused")
	assert.Equal(t, 0.0, slotGauge(t, name, "paused"))
}

// An agent told to stop finishes the job it runs, then disconnects and takes no more: the
// slot stays down, also across a restart of the spawner, rather than register anew as it
// does after a disconnect, and its Secret, the slots gauge and the probes say so. Removing
// the Secret's annotation brings it back. A slot on the streaming ping, which has no stop
// action, hears it from the ping it makes once Buildkite ends the stream.
func TestStopEndsSlotAfterItsJob(t *testing.T) {
	defer spawner.SetStoppedRecheckForTest(300 * time.Millisecond)()
	for _, mode := range pingModes {
		t.Run(mode, func(t *testing.T) { testStopEndsSlotAfterItsJob(t, mode) })
	}
}

func testStopEndsSlotAfterItsJob(t *testing.T, mode string) {
	name := "bk-stop-" + mode
	ns := newNamespace(t)
	fake := startFake(t)
	edit := func(c *spawner.Config) {
		c.Name, c.Slots, c.ReregisterAfter, c.PingMode = name, 1, 200*time.Millisecond, mode
	}
	first := startSpawner(t, fake, ns, edit)
	var a fakebuildkite.AgentSnapshot
	waitFor(t, fake, 10*time.Second, "the slot's agent", func() (ok bool) { a, ok = theAgent(fake, name+"-0"); return ok })

	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(2, goPlugin)})
	require.NoError(t, err)
	var running string
	waitFor(t, fake, 20*time.Second, "a job's BuildJob", func() bool {
		for id := range buildJobs(t, ns) {
			running = id
			return true
		}
		return false
	})
	// Told to stop while its job runs (nothing reports the BuildJob yet).
	require.NoError(t, fake.SendAgentAction(a.ID, fakebuildkite.ActionStop))
	time.Sleep(1500 * time.Millisecond)
	j, _ := fake.Job(running)
	assert.False(t, fakebuildkite.IsTerminal(j.State), "the job runs on")
	now, _ := fake.Agent(a.ID)
	assert.True(t, now.Connected, "the agent stays until its job is over")

	startReporter(t, ns, 0)
	waitJobsFinished(t, fake, []string{running}, 20*time.Second)
	waitFor(t, fake, 10*time.Second, "the stopped agent to disconnect", func() bool {
		got, _ := fake.Agent(a.ID)
		return got.State == fakebuildkite.AgentDisconnected
	})
	other := b.Jobs[0]
	if other == running {
		other = b.Jobs[1]
	}
	// Ten times ReregisterAfter: a disconnected slot would have registered anew by now.
	time.Sleep(2 * time.Second)
	stayedDown := func(when string) {
		t.Helper()
		_, up := theAgent(fake, name+"-0")
		assert.False(t, up, "%s: no agent registers for the stopped slot", when)
		j, _ := fake.Job(other)
		assert.Equal(t, fakebuildkite.StateScheduled, j.State, "%s: the stopped slot takes no more jobs", when)
		assert.Equal(t, spawner.SlotStopped, slotHeld(t, ns, name, 0), "%s: its Secret says it is stopped", when)
		assert.Equal(t, 1.0, slotGauge(t, name, "stopped"), when)
		assert.Equal(t, 0.0, slotGauge(t, name, "idle"), when)
	}
	stayedDown("after its job")
	j, _ = fake.Job(running)
	assert.Equal(t, 1, j.FinishCount, "the job it ran finished once")
	assert.Equal(t, "Stop requested by the fake's control API", slotSecret(t, ns, name, 0).Annotations[spawner.AnnotationSlotStateMessage])
	assert.NoError(t, first.sp.ReadyCheck(nil), "a stopped slot does not make the operator unready")
	assert.NoError(t, first.sp.LiveCheck(nil))

	// A restart does not bring it back.
	first.stop()
	second := startSpawner(t, fake, ns, edit)
	time.Sleep(2 * time.Second)
	stayedDown("after a restart")
	assert.NoError(t, second.sp.ReadyCheck(nil))

	// A person lets it go: it registers a new agent and takes the job left.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec := slotSecret(t, ns, name, 0)
		delete(sec.Annotations, spawner.AnnotationSlotState)
		return env.Client.Update(context.Background(), sec)
	}))
	var a2 fakebuildkite.AgentSnapshot
	waitFor(t, fake, 10*time.Second, "a new agent for the slot", func() (ok bool) { a2, ok = theAgent(fake, name+"-0"); return ok })
	assert.NotEqual(t, a.ID, a2.ID)
	waitJobsFinished(t, fake, []string{other}, 20*time.Second)
	assert.Empty(t, slotHeld(t, ns, name, 0))
	assert.Equal(t, 0.0, slotGauge(t, name, "stopped"))
}
