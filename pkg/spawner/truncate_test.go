package spawner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLongMessageTruncatedAsTheAgentDoes checks that a long BUILDKITE_MESSAGE (a commit
// message) is cut as buildkite-agent v3.138.1 cuts it before running a job
// (JobRunner.createEnvironment, truncateEnv, agent.BuildkiteMessageMax): to 64 KiB for
// "BUILDKITE_MESSAGE=value\0", ending in "[value truncated N -> M bytes]". Left whole, an
// env value of 128 KiB or more makes the exec of the pod's supervisor fail with E2BIG
// (Linux's MAX_ARG_STRLEN), and every job of the build with it. Nothing else is cut, as
// on an agent.
func TestLongMessageTruncatedAsTheAgentDoes(t *testing.T) {
	const agentMax = 64 * 1024 // agent.BuildkiteMessageMax
	// The agent cuts a value longer than the bound, however long its name makes the
	// entry, to what leaves room for the name, "=" and the terminating NUL.
	kept := agentMax - len("BUILDKITE_MESSAGE") - 2
	line := "Fix the thing. ünïcödé, quotes \"'`, $(HOME) $$ and \\ stay as they are\n"
	long := func(n int) string { return strings.Repeat(line, n/len(line)+1)[:n] }

	cases := []struct {
		name    string
		message string
		want    string
	}{
		{"short", "Merge pull request #1", "Merge pull request #1"},
		{"at the bound", long(agentMax), long(agentMax)},
		{"one byte over", long(agentMax + 1), long(agentMax + 1)[:kept-len(fmt.Sprintf("[value truncated %d -> %d bytes]", agentMax+1, kept))] +
			fmt.Sprintf("[value truncated %d -> %d bytes]", agentMax+1, kept)},
		{"200 KiB", long(200 * 1024), long(200 * 1024)[:kept-len("[value truncated 204800 -> 65517 bytes]")] + "[value truncated 204800 -> 65517 bytes]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			other := long(200 * 1024)
			job := testJob(map[string]string{"BUILDKITE_MESSAGE": tc.message, "BIG_FIXTURE": other})
			bj, err := buildJobFor(job, "ns", "https://agent.example/v3")
			require.NoError(t, err)
			got := bj.Spec.Env["BUILDKITE_MESSAGE"]
			assert.Equal(t, tc.want, got)
			if got != tc.message {
				assert.Equal(t, agentMax, len("BUILDKITE_MESSAGE=")+len(got)+1, "the entry fills the agent's bound exactly")
			}
			assert.Equal(t, other, bj.Spec.Env["BIG_FIXTURE"], "the agent truncates BUILDKITE_MESSAGE alone")
			assert.Equal(t, tc.message, job.Env["BUILDKITE_MESSAGE"], "the job as Buildkite sent it is left alone")

			if tc.want == tc.message {
				assert.Empty(t, messageTruncation(job.Env))
			} else {
				assert.Equal(t, fmt.Sprintf("BUILDKITE_MESSAGE value truncated %d -> %d bytes", len(tc.message), kept), messageTruncation(job.Env),
					"the line for the operator's log, as the agent's own")
			}
		})
	}
}
