package spawner_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// startFakeWith starts a fake with the test's registration token and short intervals,
// then opts.
func startFakeWith(t *testing.T, edit func(*fakebuildkite.Options)) *fakebuildkite.Server {
	t.Helper()
	opts := fakebuildkite.Options{RegistrationToken: regToken, PingInterval: 1, HeartbeatInterval: 1}
	edit(&opts)
	fake, err := fakebuildkite.Start(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = fake.Close() })
	return fake
}

// assertEachOnce checks that every job finished passing, accepted by one accept call and
// finished once, with one BuildJob, and returns how each was accepted.
func assertEachOnce(t *testing.T, fake *fakebuildkite.Server, ns string, ids []string) map[string]string {
	t.Helper()
	via := map[string]string{}
	bjs := buildJobs(t, ns)
	for _, id := range ids {
		j, _ := fake.Job(id)
		assert.Equal(t, "0", j.ExitStatus, "job %s", id)
		assert.Equal(t, 1, j.FinishCount, "job %s finished once", id)
		assert.Equal(t, 1, fake.RequestCount(fakebuildkite.EPAccept, id), "job %s: accept calls", id)
		_, ok := bjs[id]
		assert.True(t, ok, "job %s has its BuildJob", id)
		via[id] = j.AcceptedVia
	}
	return via
}

// TestPingModes: in each mode the slots take every job once, by the path the mode says,
// and never use the other: ping-only never opens the stream, stream-only never polls, and
// auto, with the stream up, does not poll either.
func TestPingModes(t *testing.T) {
	tests := []struct {
		mode        string
		wantVia     string
		wantStreams bool
		wantPings   bool
	}{
		{spawner.PingModePingOnly, fakebuildkite.ViaPing, false, true},
		{spawner.PingModeAuto, fakebuildkite.ViaStream, true, false},
		{spawner.PingModeStreamOnly, fakebuildkite.ViaStream, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			ns := newNamespace(t)
			fake := startFake(t)
			startReporter(t, ns, 200*time.Millisecond)
			startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots, c.PingMode = 2, tt.mode })
			waitFor(t, fake, 10*time.Second, "both slots", func() bool { return connectedAgents(fake, "bk-operator-test-") == 2 })
			// Created after the slots are up, so that in auto the stream has had the time
			// a healthy one needs to say it is there.
			time.Sleep(500 * time.Millisecond)
			b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(5, goPlugin)})
			require.NoError(t, err)
			waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
			for id, via := range assertEachOnce(t, fake, ns, b.Jobs) {
				assert.Equal(t, tt.wantVia, via, "job %s", id)
			}
			assert.Equal(t, tt.wantStreams, fake.RequestCount(fakebuildkite.EPStreamPings, "") > 0, "streaming pings opened")
			assert.Equal(t, tt.wantPings, fake.RequestCount(fakebuildkite.EPPing, "") > 0, "pings")
		})
	}
}

// TestStreamRefusedFallsBackToPolling: where Buildkite does not offer the streaming ping
// (unimplemented), each slot tries it once and polls for good; where it fails (503), the
// slots poll while it is down and go back to it once it is up, losing and doubling no job
// on the way. Stream-only, refused, takes no job and never polls.
func TestStreamRefusedFallsBackToPolling(t *testing.T) {
	t.Run("not offered", func(t *testing.T) {
		ns := newNamespace(t)
		fake := startFakeWith(t, func(o *fakebuildkite.Options) { o.NoStreaming = true })
		startReporter(t, ns, 100*time.Millisecond)
		startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 2 })
		b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(4, goPlugin)})
		require.NoError(t, err)
		waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
		for id, via := range assertEachOnce(t, fake, ns, b.Jobs) {
			assert.Equal(t, fakebuildkite.ViaPing, via, "job %s", id)
		}
		assert.Equal(t, 2, fake.RequestCount(fakebuildkite.EPStreamPings, ""), "one try of the stream per slot")
	})

	t.Run("down, then up", func(t *testing.T) {
		// Retries of the stream a tenth as far apart, for it to come back within seconds
		// of the fault's end rather than a minute.
		// (Restored after the spawner, which reads it, has stopped.)
		t.Cleanup(spawner.SetStreamRetryForTest(100 * time.Millisecond))
		ns := newNamespace(t)
		fake := startFake(t)
		fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPStreamPings, Status: 503, Message: "streaming is down"})
		startReporter(t, ns, 100*time.Millisecond)
		startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 2 })
		b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(4, goPlugin)})
		require.NoError(t, err)
		waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
		for id, via := range assertEachOnce(t, fake, ns, b.Jobs) {
			assert.Equal(t, fakebuildkite.ViaPing, via, "job %s, with the stream down", id)
		}

		fake.ClearFaults()
		waitFor(t, fake, 30*time.Second, "the slots' streams to come back", func() bool {
			n := 0
			for _, a := range fake.Agents() {
				if a.Streaming {
					n++
				}
			}
			return n == 2
		})
		time.Sleep(200 * time.Millisecond) // for the slots to hear them
		pings := fake.RequestCount(fakebuildkite.EPPing, "")
		b2, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(4, goPlugin)})
		require.NoError(t, err)
		waitJobsFinished(t, fake, b2.Jobs, 30*time.Second)
		for id, via := range assertEachOnce(t, fake, ns, b2.Jobs) {
			assert.Equal(t, fakebuildkite.ViaStream, via, "job %s, with the stream back", id)
		}
		assert.LessOrEqual(t, fake.RequestCount(fakebuildkite.EPPing, ""), pings+2, "the slots stopped polling (a ping in flight may land)")
	})

	t.Run("stream-only", func(t *testing.T) {
		ns := newNamespace(t)
		fake := startFakeWith(t, func(o *fakebuildkite.Options) { o.NoStreaming = true })
		startReporter(t, ns, 0)
		startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots, c.PingMode = 1, spawner.PingModeStreamOnly })
		waitFor(t, fake, 10*time.Second, "the slot", func() bool { return connectedAgents(fake, "bk-operator-test-") == 1 })
		b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
		require.NoError(t, err)
		time.Sleep(3 * time.Second)
		j, _ := fake.Job(b.Jobs[0])
		assert.Equal(t, fakebuildkite.StateScheduled, j.State, "a stream-only slot without its stream takes no job")
		assert.Zero(t, fake.RequestCount(fakebuildkite.EPPing, ""), "and never polls")
	})
}

// TestStreamCutMidJob cuts a slot's streaming ping while it runs each of its jobs: the job
// runs to its end once, and the next is taken once, over the stream when it is back or by a
// ping while it is not.
func TestStreamCutMidJob(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	// Every job "runs" 4 s at least: its finish waits that long in Buildkite.
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPFinish, Latency: 4 * time.Second})
	rep := startReporter(t, ns, 0)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 1 })
	var a fakebuildkite.AgentSnapshot
	streaming := func() (ok bool) {
		a, ok = theAgent(fake, "bk-operator-test-0")
		return ok && a.Streaming
	}
	waitFor(t, fake, 10*time.Second, "the slot's stream", streaming)
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(3, goPlugin)})
	require.NoError(t, err)
	for _, id := range b.Jobs { // one slot: the jobs come in order
		waitBuildJob(t, fake, ns, id)
		waitFor(t, fake, 20*time.Second, "the slot's stream, open", streaming)
		j, _ := fake.Job(id)
		require.False(t, fakebuildkite.IsTerminal(j.State), "job %s ended before the cut", id)
		fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPStreamPings, DropConnection: true, AgentID: a.ID, Times: 1})
		waitJobsFinished(t, fake, []string{id}, 30*time.Second)
	}
	via := assertEachOnce(t, fake, ns, b.Jobs)
	assert.Empty(t, rep.Errors())
	assert.Equal(t, fakebuildkite.ViaStream, via[b.Jobs[0]])
	got, _ := fake.Agent(a.ID)
	assert.GreaterOrEqual(t, got.StreamsOpened, 3, "the stream came back after each cut")
	t.Logf("jobs came by %v; %d pings", via, fake.RequestCount(fakebuildkite.EPPing, ""))
}

// TestJobOfferedByBothPathsAcceptedOnce makes Buildkite push a job over the stream while
// the slot's ping is in flight, and the ping's answer offer it again: the stream is slow
// to open (the slot polls meanwhile, as it does after a ping interval without a word), and
// the ping slower to answer. The slot accepts the job once, from the ping, and lets the
// stream's offer of it go when it comes to it.
func TestJobOfferedByBothPathsAcceptedOnce(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	id := b.Jobs[0]
	// The slot pings a second (the ping interval) after it connects; the stream opens, and
	// pushes the job, a second later; the ping's answer, which takes the job back from the
	// stream's offer and offers it again, comes two seconds after that.
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPStreamPings, Latency: 2 * time.Second, Times: 1})
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPPing, Latency: 3 * time.Second, Times: 1})
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots = 1 })
	waitJobsFinished(t, fake, b.Jobs, 30*time.Second)
	// The slot has come back to the stream's offer by the time it pings again.
	var a fakebuildkite.AgentSnapshot
	waitFor(t, fake, 10*time.Second, "the slot to be idle", func() (ok bool) {
		a, ok = theAgent(fake, "bk-operator-test-0")
		return ok && a.CurrentJob == ""
	})
	time.Sleep(time.Second)

	j, _ := fake.Job(id)
	require.Equal(t, []string{fakebuildkite.ViaStream, fakebuildkite.ViaPing}, j.OfferedVia, "the job was offered by both paths")
	assert.Equal(t, fakebuildkite.ViaPing, j.AcceptedVia)
	assertEachOnce(t, fake, ns, b.Jobs)
}

// TestStreamLifecycle: a streaming slot's registration through Buildkite's actions over the
// stream: a revoked agent is replaced, a disconnected one registers anew after
// ReregisterAfter, and each new registration streams again.
func TestStreamLifecycle(t *testing.T) {
	ns := newNamespace(t)
	fake := startFake(t)
	startReporter(t, ns, 0)
	startSpawner(t, fake, ns, func(c *spawner.Config) { c.Slots, c.ReregisterAfter = 1, time.Second })
	const name = "bk-operator-test-0"
	streaming := func(not string) func() bool {
		return func() bool { a, ok := theAgent(fake, name); return ok && a.ID != not && a.Streaming }
	}
	waitFor(t, fake, 10*time.Second, "the slot's stream", streaming(""))
	a1, _ := theAgent(fake, name)

	fake.RevokeAgent(a1.ID)
	waitFor(t, fake, 20*time.Second, "a new registration, streaming, after the revoke", streaming(a1.ID))
	a2, _ := theAgent(fake, name)

	require.NoError(t, fake.SetAgentAction(a2.ID, fakebuildkite.ActionDisconnect))
	waitFor(t, fake, 20*time.Second, "a new registration, streaming, after the disconnect", func() bool {
		old, _ := fake.Agent(a2.ID)
		return old.State == fakebuildkite.AgentDisconnected && streaming(a2.ID)()
	})
	b, err := fake.CreateBuild(fakebuildkite.BuildRequest{Pipeline: "app", PipelineYAML: pipeline(1, goPlugin)})
	require.NoError(t, err)
	waitJobsFinished(t, fake, b.Jobs, 20*time.Second)
	assert.Equal(t, fakebuildkite.ViaStream, assertEachOnce(t, fake, ns, b.Jobs)[b.Jobs[0]])
	assert.Zero(t, fake.RequestCount(fakebuildkite.EPPing, ""), "the slots never polled")
}
