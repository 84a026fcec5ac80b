package fakebuildkite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/buildkite/agent/v3/api"
	agentedgev1 "github.com/buildkite/agent/v3/api/proto/gen"
	"github.com/buildkite/agent/v3/logger"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// streamItem is one thing a streaming ping yielded: a message, or the error it ended with.
type streamItem struct {
	msg *agentedgev1.StreamPingsResponse
	err error
}

// testStream is a streaming ping opened as the agent opens it (api.Client.StreamPings).
type testStream struct {
	items  chan streamItem
	cancel context.CancelFunc
}

// openStream opens agent a's streaming ping, for agentID (a's own when "").
func openStream(t *testing.T, s *Server, a testAgent, agentID string) *testStream {
	t.Helper()
	if agentID == "" {
		agentID = a.id
	}
	c := api.NewClient(logger.Discard, api.Config{Endpoint: s.Endpoint(), Token: a.token})
	ctx, cancel := context.WithCancel(context.Background())
	seq, err := c.StreamPings(ctx, agentID)
	require.NoError(t, err)
	ts := &testStream{items: make(chan streamItem, 100), cancel: cancel}
	go func() {
		defer close(ts.items)
		for msg, err := range seq {
			ts.items <- streamItem{msg, err}
		}
	}()
	t.Cleanup(cancel)
	return ts
}

// next is the stream's next item; it fails the test when none comes within 5 s or the
// stream ended.
func (ts *testStream) next(t *testing.T) streamItem {
	t.Helper()
	select {
	case it, ok := <-ts.items:
		require.True(t, ok, "the stream ended")
		return it
	case <-time.After(5 * time.Second):
		t.Fatal("nothing on the stream for 5 s")
		return streamItem{}
	}
}

// action names what a message says: resume, pause: <reason>, disconnect: <reason>, job <id>.
func (it streamItem) action() string {
	switch {
	case it.err != nil:
		return "error " + connect.CodeOf(it.err).String()
	case it.msg.GetResume() != nil:
		return "resume"
	case it.msg.GetPause() != nil:
		return "pause: " + it.msg.GetPause().GetReason()
	case it.msg.GetDisconnect() != nil:
		return "disconnect: " + it.msg.GetDisconnect().GetReason()
	case it.msg.GetJobAssigned() != nil:
		return "job " + it.msg.GetJobAssigned().GetJob().GetId()
	}
	return fmt.Sprintf("unknown %v", it.msg)
}

// quiet checks that nothing comes on the stream for a while.
func (ts *testStream) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case it, ok := <-ts.items:
		if ok {
			t.Fatalf("the stream said %s", it.action())
		}
		t.Fatal("the stream ended")
	case <-time.After(d):
	}
}

func createBuild(t *testing.T, s *Server, yaml string) *Build {
	t.Helper()
	b, err := s.CreateBuild(BuildRequest{PipelineYAML: yaml})
	require.NoError(t, err)
	return b
}

// TestStreamPingsPushesJobs: an agent's stream says its action on connect, then gets each
// job the moment it is dispatched, and the next as soon as it finished the last; the fake
// records that the jobs went over the stream.
func TestStreamPingsPushesJobs(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "streamer", "queue=default")
	ts := openStream(t, s, a, "")
	assert.Equal(t, "resume", ts.next(t).action(), "on connect, the agent's action")
	other := registerAgent(t, s, "elsewhere", "queue=other")
	openStream(t, s, other, "")
	waitAgent(t, s, a.id, func(a AgentSnapshot) bool { return a.Streaming })

	b := createBuild(t, s, "steps:\n  - command: one\n  - command: two\n")
	assert.Equal(t, "job "+b.Jobs[0], ts.next(t).action(), "pushed at once")
	ts.quiet(t, 300*time.Millisecond) // one job at a time
	r := call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/accept", a.token, nil)
	require.Equal(t, 200, r.status, "%s", r.body)
	var j struct{ Token string }
	r.json(t, &j)
	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/start", j.Token, map[string]any{"started_at": time.Now()}).status)
	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/finish", j.Token, map[string]any{"exit_status": "0"}).status)
	assert.Equal(t, "job "+b.Jobs[1], ts.next(t).action(), "the next job once the agent is free")

	first, _ := s.Job(b.Jobs[0])
	assert.Equal(t, []string{ViaStream}, first.OfferedVia)
	assert.Equal(t, ViaStream, first.AcceptedVia)
	snap, _ := s.Agent(a.id)
	assert.Equal(t, 1, snap.StreamsOpened)
	assert.Zero(t, snap.PingCount, "the agent never pinged")
	assert.Equal(t, 2, s.RequestCount(EPStreamPings, ""))
}

// TestStreamPingsActions: the control API's actions reach an open stream as they are set.
// Stop, which the streaming protocol lacks, ends the stream (and refuses a new one), so
// that the agent pings and hears it there.
func TestStreamPingsActions(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "streamer", "queue=default")
	require.NoError(t, s.SetAgentAction(a.id, ActionPause))
	ts := openStream(t, s, a, "")
	assert.Equal(t, "pause: "+pauseMessage, ts.next(t).action(), "paused before it connected")
	b := createBuild(t, s, "steps:\n  - command: one\n")
	ts.quiet(t, 300*time.Millisecond) // nothing for a paused agent
	require.NoError(t, s.SetAgentAction(a.id, ActionIdle))
	assert.Equal(t, "resume", ts.next(t).action())
	assert.Equal(t, "job "+b.Jobs[0], ts.next(t).action(), "the waiting job, once resumed")
	require.NoError(t, s.SetAgentAction(a.id, ActionDisconnect))
	assert.Equal(t, "disconnect: "+disconnectMessage, ts.next(t).action())

	require.NoError(t, s.SetAgentAction(a.id, ActionIdle))
	assert.Equal(t, "resume", ts.next(t).action())
	require.NoError(t, s.SendAgentAction(a.id, ActionStop))
	assert.Equal(t, "error unavailable", ts.next(t).action(), "stop ends the stream")
	again := openStream(t, s, a, "")
	assert.Equal(t, "error unavailable", again.next(t).action(), "and refuses a new one while it holds")
	assert.Equal(t, ActionStop, ping(t, s, a).Action, "the ping says stop")
}

// TestStreamPingsRefused: the stream checks the agent's access token and the agent it is
// for, with the codes the agent takes as final.
func TestStreamPingsRefused(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "streamer", "queue=default")
	b := registerAgent(t, s, "other", "queue=default")
	tests := []struct {
		name    string
		agent   testAgent
		agentID string
		want    string
	}{
		{"unknown token", testAgent{id: a.id, token: "nope"}, "", "error unauthenticated"},
		{"another agent's id", a, b.id, "error permission_denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, openStream(t, s, tt.agent, tt.agentID).next(t).action())
		})
	}
	ts := openStream(t, s, a, "")
	assert.Equal(t, "resume", ts.next(t).action())
	s.RevokeAgent(a.id)
	assert.Equal(t, "error unauthenticated", openStream(t, s, a, "").next(t).action(), "a revoked agent")

	off := startFake(t, Options{NoStreaming: true})
	c := registerAgent(t, off, "poller", "queue=default")
	assert.Equal(t, "error unimplemented", openStream(t, off, c, "").next(t).action(), "a fake without streaming")
}

// TestStreamPingsFaults: a fault on the streaming ping ends the streams open when it is
// injected (cut, or with the status's code) and then applies to new ones. A job pushed into
// a stream that was cut is pushed again when the stream comes back, and a ping taking it
// instead is recorded as such.
func TestStreamPingsFaults(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "streamer", "queue=default")
	ts := openStream(t, s, a, "")
	assert.Equal(t, "resume", ts.next(t).action())
	b := createBuild(t, s, "steps:\n  - command: one\n")
	assert.Equal(t, "job "+b.Jobs[0], ts.next(t).action())

	s.Inject(Fault{Endpoint: EPStreamPings, DropConnection: true, AgentID: a.id, Times: 1})
	cut := ts.next(t)
	require.Error(t, cut.err, "the stream was cut")
	assert.NotEqual(t, connect.CodeDeadlineExceeded, connect.CodeOf(cut.err), "which the agent must not take for a routine reconnect")
	ts = openStream(t, s, a, "")
	assert.Equal(t, "resume", ts.next(t).action(), "the fault was used up on the open stream")
	assert.Equal(t, "job "+b.Jobs[0], ts.next(t).action(), "the job not yet accepted, told again")

	s.Inject(Fault{Endpoint: EPStreamPings, Status: 503})
	assert.Equal(t, "error unavailable", ts.next(t).action(), "an open stream ended with the status's code")
	assert.Equal(t, "error unavailable", openStream(t, s, a, "").next(t).action(), "and a new one refused")
	s.ClearFaults()

	// The agent pings instead of accepting: the ping takes the job back and offers it again.
	p := ping(t, s, a)
	require.NotNil(t, p.Job)
	assert.Equal(t, b.Jobs[0], p.Job.ID)
	require.Equal(t, 200, call(t, s, "PUT", "/jobs/"+b.Jobs[0]+"/accept", a.token, nil).status)
	j, _ := s.Job(b.Jobs[0])
	assert.Equal(t, []string{ViaStream, ViaStream, ViaPing}, j.OfferedVia)
	assert.Equal(t, ViaPing, j.AcceptedVia, "accepted from the ping's offer")
	assert.Equal(t, 1, j.AcceptCount)
}

// TestDisconnectGivesBackOfferedJob: an agent that disconnects with a job offered and not
// accepted gives it back, and the job goes to another agent.
func TestDisconnectGivesBackOfferedJob(t *testing.T) {
	s := startFake(t, Options{})
	a := registerAgent(t, s, "first", "queue=default")
	ts := openStream(t, s, a, "")
	assert.Equal(t, "resume", ts.next(t).action())
	b := createBuild(t, s, "steps:\n  - command: one\n")
	assert.Equal(t, "job "+b.Jobs[0], ts.next(t).action())
	require.Equal(t, 200, call(t, s, "POST", "/disconnect", a.token, nil).status)
	j, _ := s.Job(b.Jobs[0])
	assert.Equal(t, StateScheduled, j.State)

	next := registerAgent(t, s, "second", "queue=default")
	p := ping(t, s, next)
	require.NotNil(t, p.Job, "offered to the next agent")
	assert.Equal(t, b.Jobs[0], p.Job.ID)
}

func waitAgent(t *testing.T, s *Server, id string, cond func(AgentSnapshot) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.WaitFor(ctx, func() bool { a, _ := s.Agent(id); return cond(a) }))
}
