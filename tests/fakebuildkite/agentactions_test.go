package fakebuildkite

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every ping action can be sent to one agent through the control API, and holds until
// it is changed: an agent told to pause, disconnect or stop is offered no job, and only
// that agent is.
func TestAgentActions(t *testing.T) {
	for _, action := range []string{ActionPause, ActionDisconnect, ActionStop} {
		t.Run(action, func(t *testing.T) {
			s := startFake(t, Options{})
			held := registerAgent(t, s, "held", "queue=default")
			other := registerAgent(t, s, "other", "queue=default")
			r := call(t, s, "POST", s.URL()+fmt.Sprintf("/control/agents/%s/action", held.id), "", map[string]string{"action": action})
			require.Equal(t, http.StatusOK, r.status, "control: %s", r.body)
			var snap AgentSnapshot
			r.json(t, &snap)
			assert.Equal(t, action, snap.Action)

			_, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: x\n"})
			require.NoError(t, err)
			for range 2 {
				p := ping(t, s, held)
				assert.Equal(t, action, p.Action, "it holds for every ping")
				assert.Nil(t, p.Job, "no job for an agent told to %s", action)
			}
			p := ping(t, s, other)
			assert.Equal(t, ActionIdle, p.Action)
			require.NotNil(t, p.Job, "the other agent is offered the job")
		})
	}
	t.Run("resume", func(t *testing.T) {
		s := startFake(t, Options{})
		a := registerAgent(t, s, "paused", "queue=default")
		require.NoError(t, s.SendAgentAction(a.id, ActionPause))
		_, err := s.CreateBuild(BuildRequest{PipelineYAML: "steps:\n  - command: x\n"})
		require.NoError(t, err)
		assert.Nil(t, ping(t, s, a).Job)
		require.NoError(t, s.SendAgentAction(a.id, ActionIdle))
		assert.NotNil(t, ping(t, s, a).Job, "a resumed agent is offered the job")
	})
	t.Run("unknown", func(t *testing.T) {
		s := startFake(t, Options{})
		a := registerAgent(t, s, "a", "queue=default")
		assert.Error(t, s.SendAgentAction(a.id, "explode"))
		assert.Error(t, s.SendAgentAction("no-such-agent", ActionStop))
	})
}
