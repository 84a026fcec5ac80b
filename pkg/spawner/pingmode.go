package spawner

import (
	"fmt"
	"net/url"
)

// Ping modes (Config.PingMode): how slots learn of their jobs and of Buildkite's actions,
// as the agent's --ping-mode.
const (
	// PingModeAuto takes them from Buildkite's streaming ping, which pushes a job the
	// moment it is dispatched, and polls while the stream is down; for good, for the
	// registration, where Buildkite does not offer it.
	PingModeAuto = "auto"
	// PingModePingOnly polls GET /ping every ping interval and never opens the stream.
	PingModePingOnly = "ping-only"
	// PingModeStreamOnly takes them from the stream alone and never polls: a slot whose
	// stream is down waits for it to come back. Buildkite's stop action, which the
	// streaming protocol lacks, then reaches no slot.
	PingModeStreamOnly = "stream-only"
)

// pingModePollOnly is the agent's own name for ping-only, taken for it.
const pingModePollOnly = "poll-only"

// streamingPingsHost is the only host the agent tells it can take streamed jobs
// (clicommand/agent_start.go, Features): the feature is Buildkite's to read there.
const streamingPingsHost = "agent-edge.buildkite.com"

// canonicalPingMode checks a ping mode and returns it as the constants name it; "" is auto.
func canonicalPingMode(mode string) (string, error) {
	switch mode {
	case "", PingModeAuto:
		return PingModeAuto, nil
	case PingModePingOnly, pingModePollOnly:
		return PingModePingOnly, nil
	case PingModeStreamOnly:
		return PingModeStreamOnly, nil
	}
	return "", fmt.Errorf("ping mode %q: give auto (the streaming ping where Buildkite offers it, else polling), ping-only or stream-only", mode)
}

// streams: the slots open Buildkite's streaming ping.
func (c *Config) streams() bool { return c.PingMode != PingModePingOnly }

// polls: the slots ping, always (ping-only) or while their stream is down (auto).
func (c *Config) polls() bool { return c.PingMode != PingModeStreamOnly }

// features are the features a slot registers with: what the agent tells Buildkite, where
// it tells it, of what the slots do as the agent does.
func (c *Config) features() []string {
	u, err := url.Parse(c.Endpoint)
	if err == nil && u.Host == streamingPingsHost && c.streams() {
		return []string{"streaming-pings"}
	}
	return nil
}
