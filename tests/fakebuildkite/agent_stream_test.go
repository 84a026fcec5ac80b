package fakebuildkite

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRealAgentStreaming runs the real agent (--ping-mode auto, its default) against the
// fake's streaming ping: it takes its jobs over the stream without ever polling while the
// stream is up, honours a pause and a resume pushed to it, survives the stream being cut
// in the middle of a job (the job finishes once, the next is taken once), and leaves when
// told to disconnect. TestRealAgentRunsCommandStep has the same agent falling back to
// polling when the fake does not offer the stream.
func TestRealAgentStreaming(t *testing.T) {
	t.Parallel()
	s := startFake(t, Options{})
	repo, sha := gitRepo(t, nil)
	agent := startAgent(t, s, "stream-1", []string{"queue=default"})
	var id string
	waitAgentStreaming := func() {
		t.Helper()
		ctx := t.Context()
		require.NoError(t, s.WaitFor(ctx, func() bool {
			for _, a := range s.Agents() {
				if a.Name == "stream-1" && a.Streaming {
					id = a.ID
					return true
				}
			}
			return false
		}), "the agent never opened its streaming ping; output:\n%s", agent.out.String())
	}
	waitAgentStreaming()

	// Paused over the stream: the job waits, and the agent does not poll.
	require.NoError(t, s.SetAgentAction(id, ActionPause))
	b, err := s.CreateBuild(BuildRequest{
		PipelineYAML: "steps:\n  - command: echo first; sleep 4; echo first done\n  - command: echo second\n",
		Repo:         repo, Commit: sha,
	})
	require.NoError(t, err)
	time.Sleep(2 * time.Second)
	j, _ := s.Job(b.Jobs[0])
	assert.Equal(t, StateScheduled, j.State, "a paused agent was given a job")
	require.NoError(t, s.SetAgentAction(id, ActionIdle))

	// Mid-job, the stream is cut.
	waitJob(t, s, b.Jobs[0], func(j JobSnapshot) bool { return strings.Contains(string(j.Log), "first\n") })
	assert.Zero(t, s.RequestCount(EPPing, ""), "the agent polled although its stream was up")
	s.Inject(Fault{Endpoint: EPStreamPings, DropConnection: true, AgentID: id, Times: 1})

	for _, jobID := range b.Jobs {
		j := waitJob(t, s, jobID, func(j JobSnapshot) bool { return IsTerminal(j.State) })
		assert.Equal(t, StateFinished, j.State, "job %s", jobID)
		assert.Equal(t, "0", j.ExitStatus, "job %s; log:\n%s", jobID, j.Log)
		assert.Equal(t, 1, j.AcceptCount, "job %s accepted once", jobID)
		assert.Equal(t, 1, j.FinishCount, "job %s finished once", jobID)
		assert.Equal(t, 1, j.StartCount, "job %s started once", jobID)
		assert.Contains(t, []string{ViaStream, ViaPing}, j.AcceptedVia, "job %s", jobID)
	}
	first, _ := s.Job(b.Jobs[0])
	assert.Equal(t, []string{ViaStream}, first.OfferedVia, "the first job was pushed over the stream, once")
	assert.Equal(t, ViaStream, first.AcceptedVia)
	assert.Contains(t, string(first.Log), "first done", "the job ran to its end across the cut")
	second, _ := s.Job(b.Jobs[1])
	assert.True(t, second.AcceptedAt.After(first.FinishedAt), "the second job came after the first")

	// The order of calls: no ping before the first accept, the stream having been up.
	eps := endpointsOf(s.Requests())
	t.Logf("the agent's calls: %v; the second job came by %s", eps, second.AcceptedVia)
	require.GreaterOrEqual(t, len(eps), 5, "%v", eps)
	assert.Equal(t, []string{EPRegister, EPConnect, EPStreamPings}, eps[:3])
	if i := indexOf(eps, EPPing); i >= 0 {
		assert.Greater(t, i, indexOf(eps, EPAccept), "a ping only after the stream was cut: %v", eps)
	}
	assert.GreaterOrEqual(t, s.RequestCount(EPStreamPings, ""), 2, "the agent opened its stream again after the cut")
	assert.Contains(t, agent.out.String(), "Ping stream connection established")
	assert.NotContains(t, agent.out.String(), "falling back to polling")

	// Told to disconnect, over whichever path is up, the agent leaves.
	require.NoError(t, s.SetAgentAction(id, ActionDisconnect))
	agent.wait(t)
	a, _ := s.Agent(id)
	assert.Equal(t, AgentDisconnected, a.State)
	assert.True(t, slices.Contains(endpointsOf(s.Requests()), EPDisconnect))
}
