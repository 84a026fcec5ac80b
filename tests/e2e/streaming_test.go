package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// operatorQueue is the tag of the suite's operator's slots (the chart's buildkite.queue).
const operatorQueue = "queue=bk-operator"

// TestStreamingDispatch: the chart-installed operator (--ping-mode auto, the chart's
// default) takes its jobs from the suite's fake over Buildkite's streaming ping, which the
// fake offers: every slot keeps its stream open, each job is pushed to one at once and
// accepted from that push, never by a ping, and runs as any other.
func TestStreamingDispatch(t *testing.T) {
	e := needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Every slot streaming: one whose stream an earlier test held back comes back to it
	// within its retry window (at most about a minute), polling meanwhile.
	streaming := func() (up, all int) {
		for _, a := range e.Fake.Agents() {
			if a.Connected && slices.Contains(a.Tags, operatorQueue) {
				all++
				if a.Streaming {
					up++
				}
			}
		}
		return up, all
	}
	require.NoError(t, e.Fake.WaitFor(ctx, func() bool { up, all := streaming(); return all >= spawn && up == all }),
		"the operator's slots did not all open their streaming ping; the operator's log ends:\n%s", e.Operator.Tail(30))
	// The pings of the operator's agents (a second release's have another queue).
	pings := func() int {
		ours := map[string]bool{}
		for _, a := range e.Fake.Agents() {
			ours[a.ID] = slices.Contains(a.Tags, operatorQueue)
		}
		n := 0
		for _, r := range e.Fake.Requests() {
			if r.Endpoint == fakebuildkite.EPPing && ours[r.AgentID] {
				n++
			}
		}
		return n
	}
	before := pings()

	for _, tc := range []jobCase{
		{
			name:     "first pushed job",
			pipeline: "steps:\n  - command: echo pushed over the stream\n",
			state:    fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"pushed over the stream"},
		},
		{
			name:     "second pushed job",
			pipeline: "steps:\n  - command: echo pushed again\n",
			state:    fakebuildkite.StateFinished, exitStatus: "0",
			logHas: []string{"pushed again"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := runCase(t, e, tc)
			assert.Equal(t, []string{fakebuildkite.ViaStream}, j.OfferedVia, "the job was offered once, over the stream")
			assert.Equal(t, fakebuildkite.ViaStream, j.AcceptedVia, "and accepted from that offer")
			assert.Equal(t, 1, e.Fake.RequestCount(fakebuildkite.EPAccept, j.ID), "one accept")
			// How fast a pushed job is accepted is the bench's to measure (make bench,
			// "dispatch → accepted"): a bound on it here failed a cold CI run at 1.003 s on
			// a loaded machine. That it was pushed, not polled for, the offers say.
			a, ok := e.Fake.Agent(j.AcceptedBy)
			require.True(t, ok)
			assert.True(t, a.Streaming, "the slot that took it streams still")
		})
	}
	up, all := streaming()
	assert.Equal(t, all, up, "slots streaming after the jobs")
	assert.Equal(t, before, pings(), "no slot polled while its stream was up")
}
