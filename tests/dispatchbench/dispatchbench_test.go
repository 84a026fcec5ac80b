package dispatchbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/buildkite-operator/buildkite-operator/pkg/spawner"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

func TestSetupString(t *testing.T) {
	tests := []struct {
		setup Setup
		want  string
	}{
		{Full, "ping interval 10 s, 8 slots, 20 jobs 2-6 s apart"},
		{Short, "ping interval 10 s, 8 slots, 5 jobs 0.5-1.5 s apart"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.setup.String())
			assert.NoError(t, tt.setup.validate())
		})
	}
}

func TestSetupValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Setup)
		msg  string
	}{
		{"no ping interval", func(s *Setup) { s.PingInterval = 0 }, "ping interval 0 s"},
		{"no slots", func(s *Setup) { s.Slots = 0 }, "0 slots"},
		{"no jobs", func(s *Setup) { s.Jobs = 0 }, "0 jobs"},
		{"gaps upside down", func(s *Setup) { s.MinGap, s.MaxGap = 2*time.Second, time.Second }, "gaps 2s-1s"},
		{"negative gap", func(s *Setup) { s.MinGap = -time.Second }, "gaps -1s-6s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Full
			tt.edit(&s)
			assert.ErrorContains(t, s.validate(), tt.msg)
		})
	}
	equal := Full
	equal.MaxGap = equal.MinGap
	assert.NoError(t, equal.validate(), "a fixed gap is allowed")
}

func TestRunCheck(t *testing.T) {
	stream := Job{ID: "a", AcceptedVia: fakebuildkite.ViaStream, Accepts: 1}
	ping := Job{ID: "b", AcceptedVia: fakebuildkite.ViaPing, Accepts: 1}
	twice := Job{ID: "c", AcceptedVia: fakebuildkite.ViaStream, Accepts: 2}
	tests := []struct {
		name     string
		run      Run
		fromPing int
		msg      string // "" for no error
	}{
		{"streaming, all pushed", Run{PingMode: spawner.PingModeAuto, Jobs: []Job{stream, stream}}, 0, ""},
		{"streaming, one from a ping", Run{PingMode: spawner.PingModeAuto, Jobs: []Job{stream, ping}}, 1, `job b was taken from a "ping", not from the stream's push`},
		{"polling takes from pings", Run{PingMode: spawner.PingModePingOnly, Jobs: []Job{ping, ping}}, 2, ""},
		{"accepted twice", Run{PingMode: spawner.PingModePingOnly, Jobs: []Job{ping, twice}}, 1, "job c was accepted 2 times, not once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.fromPing, tt.run.FromPing())
			err := tt.run.Check()
			if tt.msg == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.msg)
		})
	}
}
