package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunServesUntilCanceled(t *testing.T) {
	pipeline := filepath.Join(t.TempDir(), "pipeline.yml")
	require.NoError(t, os.WriteFile(pipeline, []byte("steps:\n  - command: echo hi\n"), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-registration-token", "tok", "-pipeline", pipeline, "-quiet"}, pw, io.Discard)
		_ = pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	endpoint := strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(endpoint, "http://127.0.0.1:") && strings.HasSuffix(endpoint, "/v3"), endpoint)

	for _, tc := range []struct {
		token string
		want  int
	}{{"tok", http.StatusCreated}, {"fake-registration-token", http.StatusUnauthorized}} {
		req, err := http.NewRequest("POST", endpoint+"/register", strings.NewReader(`{"name":"x","meta_data":["queue=default"]}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Token "+tc.token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, tc.want, resp.StatusCode)
	}
	resp, err := http.Get(strings.TrimSuffix(endpoint, "/v3") + "/control/jobs")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Contains(t, string(body), `"command":"echo hi"`, "the -pipeline build exists")

	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	_, err = http.Get(endpoint + "/ping")
	assert.Error(t, err, "the server is closed")
}

func TestRunRejectsBadFlags(t *testing.T) {
	assert.Error(t, run(context.Background(), []string{"-nope"}, io.Discard, io.Discard))
	assert.Error(t, run(context.Background(), []string{"stray"}, io.Discard, io.Discard))
	assert.Error(t, run(context.Background(), []string{"-listen", "127.0.0.1:0", "-pipeline", "/does/not/exist"}, io.Discard, io.Discard))
}

// TestNoStreamingFlag: the streaming ping is served unless -no-streaming, which answers it
// as Buildkite does where it does not offer it (gRPC status 12, unimplemented) so that
// agents poll. Served, a call without a token is refused (16, unauthenticated).
func TestNoStreamingFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "16"},
		{[]string{"-no-streaming"}, "12"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(append([]string{"flags"}, tt.args...), " "), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, append([]string{"-listen", "127.0.0.1:0", "-quiet"}, tt.args...), pw, io.Discard)
				_ = pw.Close()
			}()
			line, err := bufio.NewReader(pr).ReadString('\n')
			require.NoError(t, err)
			base := strings.TrimSuffix(strings.TrimSpace(line), "/v3")
			// One gRPC message: not compressed, 0 bytes long (an empty StreamPingsRequest).
			req, err := http.NewRequest("POST", base+"/agentedge.v1.AgentEdgeService/StreamPings", strings.NewReader("\x00\x00\x00\x00\x00"))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/grpc")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			status := resp.Header.Get("Grpc-Status")
			if status == "" {
				status = resp.Trailer.Get("Grpc-Status")
			}
			assert.Equal(t, tt.want, status)
			cancel()
			require.NoError(t, <-done)
		})
	}
}
