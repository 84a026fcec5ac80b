package supervisor

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestRefusedChunkIsToldInTheLog: a chunk Buildkite refuses is missing from the log, and the
// log says so after the hole (how many bytes, which); the progress record and the finish
// count the chunk and its bytes.
func TestRefusedChunkIsToldInTheLog(t *testing.T) {
	command := `for i in $(seq 1 200); do echo "line $i of the job's output"; done`
	h := newHarness(t, fakebuildkite.Options{ChunksMaxSizeBytes: 1024}, fakebuildkite.BuildRequest{PipelineYAML: pipeline(command)})
	h.env[podcontract.EnvChunkMaxBytes] = "1024"
	// The first chunk to arrive is refused, as Buildkite refuses a chunk it cannot take. With
	// two uploaders that may be the second chunk, so the notice is checked against the bytes
	// the progress record says were lost, wherever they were.
	h.s.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPChunks, Status: http.StatusUnprocessableEntity, Times: 1,
		Message: "Chunk refused for the test"})
	require.Equal(t, 0, h.start("--finish").wait(t, 30*time.Second))

	snap := h.snapshot()
	log := fakebuildkite.PlainLog(snap.Log)
	var notice string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "missing above") {
			notice = line
		}
	}
	require.NotEmpty(t, notice, "no notice of the hole in the log:\n%s", log)
	t.Logf("notice: %s", notice)
	p := h.readProgress()
	assert.Equal(t, 1, p.FailedChunks)
	assert.Positive(t, p.LostBytes)
	assert.LessOrEqual(t, p.LostBytes, uint64(1024))
	assert.Contains(t, notice, "Chunk refused for the test")
	m := regexp.MustCompile(`(\d+) bytes of this log are missing above: Buildkite refused log bytes (\d+) to (\d+) \(1 chunk\)`).FindStringSubmatch(notice)
	require.NotNil(t, m, "the notice does not say which bytes are missing: %s", notice)
	from, _ := strconv.ParseUint(m[2], 10, 64)
	to, _ := strconv.ParseUint(m[3], 10, 64)
	assert.Equal(t, fmt.Sprint(p.LostBytes), m[1])
	assert.Equal(t, p.LostBytes, to-from, "the range the notice names")
	assert.Equal(t, 1, snap.ChunksFailedCount, "the finish counts the refused chunk")
	assert.Contains(t, log, "line 200 of the job's output\n")
	assert.True(t, p.Flushed)
}
