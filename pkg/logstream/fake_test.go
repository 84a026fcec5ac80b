package logstream

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// startedJob starts a fake, makes a one-step build, takes its job as an agent would and starts
// it, and returns a client holding the job token.
func startedJob(t testing.TB, opts fakebuildkite.Options) (*fakebuildkite.Server, fakebuildkite.AcceptedJob, *agentapi.Client) {
	t.Helper()
	s, err := fakebuildkite.Start(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.CreateBuild(fakebuildkite.BuildRequest{PipelineYAML: "steps:\n  - command: echo hi\n    agents: {queue: logstream}\n"})
	require.NoError(t, err)
	job := s.AcceptJobForTest(t, "logstream-test", "queue=logstream")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	jc := agentapi.New(agentapi.Config{Endpoint: s.Endpoint(), Token: job.Token, WaitScale: 0.01})
	require.NoError(t, jc.Start(ctx, job.ID, time.Now()))
	return s, job, jc
}

func uploadTo(c *agentapi.Client, jobID string) UploadFunc {
	return func(ctx context.Context, seq, off uint64, data []byte) error {
		return c.UploadChunk(ctx, jobID, seq, off, data)
	}
}

func TestStreamToFakeWithFaults(t *testing.T) {
	tests := []struct {
		name  string
		fault fakebuildkite.Fault
		// retries is how many requests more than chunks the fault causes.
		retries    int
		wantFailed int
		// lost says whether a chunk's bytes are missing from Buildkite's log.
		lost bool
	}{
		{name: "5xx twice is retried", fault: fakebuildkite.Fault{Endpoint: fakebuildkite.EPChunks, Status: http.StatusServiceUnavailable, Times: 2}, retries: 2},
		{name: "429 is retried", fault: fakebuildkite.Fault{Endpoint: fakebuildkite.EPChunks, Status: http.StatusTooManyRequests, Times: 1}, retries: 1},
		{name: "a dropped connection is retried", fault: fakebuildkite.Fault{Endpoint: fakebuildkite.EPChunks, DropConnection: true, Times: 1}, retries: 1},
		{name: "a 4xx loses the chunk", fault: fakebuildkite.Fault{Endpoint: fakebuildkite.EPChunks, Status: http.StatusUnprocessableEntity, Times: 1}, wantFailed: 1, lost: true},
	}
	for _, tt := range tests {
		for _, uploaders := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s, %d uploaders", tt.name, uploaders), func(t *testing.T) {
				s, job, jc := startedJob(t, fakebuildkite.Options{ChunksMaxSizeBytes: 1024})
				s.Inject(tt.fault)
				st, err := New(Config{MaxChunkBytes: int(job.ChunksMaxSizeBytes), Interval: time.Hour, Upload: uploadTo(jc, job.ID), Uploaders: uploaders})
				require.NoError(t, err)
				var want bytes.Buffer
				for i := range 200 {
					line := bytes.Repeat([]byte{byte('a' + i%26)}, i%50)
					want.Write(line)
					want.WriteByte('\n')
					_, err := st.Write(append(line, '\n'))
					require.NoError(t, err)
				}
				stats, err := st.Close(context.Background())
				require.NoError(t, err)
				assert.Equal(t, tt.wantFailed, stats.FailedChunks)

				snap, ok := s.Job(job.ID)
				require.True(t, ok)
				assert.Equal(t, int(stats.Sequence)-tt.wantFailed, snap.ChunkCount)
				assert.Equal(t, stats.Sequence, uint64(s.RequestCount(fakebuildkite.EPChunks, job.ID)-tt.retries),
					"one request per chunk, plus the retries")
				if tt.lost {
					assert.Less(t, uint64(len(snap.Log)), stats.Offset)
					assert.NotEqual(t, want.String(), fakebuildkite.PlainLog(snap.Log))
					return
				}
				assert.Equal(t, stats.Offset, uint64(len(snap.Log)))
				assert.Equal(t, want.String(), stripTimestamps(t, snap.Log))
			})
		}
	}
}
