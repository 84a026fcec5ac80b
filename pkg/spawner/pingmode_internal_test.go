package spawner

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

func TestPingModeFlag(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{name: "default", want: PingModeAuto},
		{name: "flag", args: []string{"-ping-mode=stream-only"}, want: PingModeStreamOnly},
		{name: "env", env: map[string]string{"BK_OPERATOR_PING_MODE": "ping-only"}, want: PingModePingOnly},
		{name: "the agent's name for ping-only", args: []string{"-ping-mode=poll-only"}, want: PingModePingOnly},
		{name: "flag over env", args: []string{"-ping-mode=auto"}, env: map[string]string{"BK_OPERATOR_PING_MODE": "ping-only"}, want: PingModeAuto},
		{name: "unknown", args: []string{"-ping-mode=push"}, wantErr: `-ping-mode: ping mode "push": give auto`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			c.BindFlags(fs)
			require.NoError(t, flagenv.ParseEnv(fs, tt.args, func(k string) string { return tt.env[k] }))
			err := c.FinishFlags(fs)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, c.PingMode)
		})
	}
}

func TestFeatures(t *testing.T) {
	tests := []struct {
		endpoint, mode string
		want           []string
	}{
		{"https://agent-edge.buildkite.com/v3", PingModeAuto, []string{"streaming-pings"}},
		{"https://agent-edge.buildkite.com/v3", PingModeStreamOnly, []string{"streaming-pings"}},
		{"https://agent-edge.buildkite.com/v3", PingModePingOnly, nil},
		// As the agent: only there does Buildkite read it.
		{"https://agent.buildkite.com/v3", PingModeAuto, nil},
	}
	for _, tt := range tests {
		c := Config{Endpoint: tt.endpoint, PingMode: tt.mode}
		assert.Equal(t, tt.want, c.features(), "%s, %s", tt.endpoint, tt.mode)
	}
}

// TestStreamBox: what the stream heard while the slot was busy comes down to the one
// action that matters and the jobs, each once.
func TestStreamBox(t *testing.T) {
	type put struct{ action, job string }
	tests := []struct {
		name string
		puts []put
		want []offer // what the slot takes, in turn, until nothing
	}{
		{"nothing", nil, nil},
		{"a job", []put{{streamResume, ""}, {"", "j1"}}, []offer{{jobID: "j1"}}},
		{"the same job twice", []put{{"", "j1"}, {"", "j1"}}, []offer{{jobID: "j1"}}},
		{"jobs in order", []put{{"", "j1"}, {"", "j2"}}, []offer{{jobID: "j1"}, {jobID: "j2"}}},
		{"pause then resume: resumed", []put{{streamPause, ""}, {streamResume, ""}}, []offer{{}}},
		{"resume then pause: paused", []put{{streamResume, ""}, {streamPause, ""}}, []offer{{action: streamPause}}},
		{"a disconnect stands", []put{{streamDisconnect, ""}, {streamResume, ""}, {streamPause, ""}}, []offer{{action: streamDisconnect}}},
		{"a job waits behind a pause", []put{{"", "j1"}, {streamPause, ""}}, []offer{{action: streamPause}}},
		{"and comes with the resume", []put{{"", "j1"}, {streamPause, ""}, {streamResume, ""}}, []offer{{jobID: "j1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newStreamBox()
			for _, p := range tt.puts {
				if p.job != "" {
					b.putJob(p.job)
				} else {
					b.putAction(p.action, "")
				}
			}
			var got []offer
			for {
				o, ok := b.take()
				if !ok {
					break
				}
				o.via = ""
				got = append(got, o)
				require.Less(t, len(got), 10, "take never runs dry")
			}
			assert.Equal(t, tt.want, got)
		})
	}

	t.Run("jobs behind a taken pause wait for Buildkite's next word", func(t *testing.T) {
		b := newStreamBox()
		b.putJob("j1")
		b.putAction(streamPause, "maintenance")
		o, ok := b.take()
		require.True(t, ok)
		assert.Equal(t, offer{action: streamPause, message: "maintenance", via: viaStream}, o)
		_, ok = b.take()
		assert.False(t, ok, "j1 waits while paused")
		b.putJob("j2")
		o, _ = b.take()
		assert.Equal(t, "j1", o.jobID, "a job pushed means resumed: the first waiting goes first")
		assert.Equal(t, []string{"j2"}, b.queued())
	})
}
