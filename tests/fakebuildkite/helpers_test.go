package fakebuildkite

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startFake starts a fake for one test and closes it at the end.
func startFake(t *testing.T, opts Options) *Server {
	t.Helper()
	return StartForTest(t, opts)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(r.body, v), "body: %s", r.body)
}

func (r response) message(t *testing.T) string {
	t.Helper()
	var m struct {
		Message string `json:"message"`
	}
	r.json(t, &m)
	return m.Message
}

// call makes one agent API request with "Authorization: Token <token>" (none when token is "").
func call(t *testing.T, s *Server, method, path, token string, body any) response {
	t.Helper()
	status, header, b := s.requestForTest(t, method, path, token, body)
	return response{status: status, header: header, body: b}
}

// postChunk uploads one gzip log chunk as the agent does.
func postChunk(t *testing.T, s *Server, jobID, token string, seq int, offset int, data []byte) response {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(data)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	req, err := http.NewRequest(http.MethodPost,
		fmt.Sprintf("%s/jobs/%s/chunks?sequence=%d&offset=%d&size=%d", s.Endpoint(), jobID, seq, offset, len(data)), &buf)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Token "+token)
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

type testAgent struct {
	id, token string
}

// registerAgent registers and connects an agent with tags over HTTP.
func registerAgent(t *testing.T, s *Server, name string, tags ...string) testAgent {
	t.Helper()
	r := call(t, s, "POST", "/register", s.RegistrationToken(), map[string]any{"name": name, "meta_data": tags})
	require.Equal(t, http.StatusCreated, r.status, "register: %s", r.body)
	var reg struct {
		ID          string `json:"id"`
		AccessToken string `json:"access_token"`
	}
	r.json(t, &reg)
	require.NotEmpty(t, reg.AccessToken)
	r = call(t, s, "POST", "/connect", reg.AccessToken, nil)
	require.Equal(t, http.StatusOK, r.status, "connect: %s", r.body)
	return testAgent{id: reg.ID, token: reg.AccessToken}
}

type pingResult struct {
	Action string `json:"action"`
	Job    *struct {
		ID string `json:"id"`
	} `json:"job"`
}

func ping(t *testing.T, s *Server, a testAgent) pingResult {
	t.Helper()
	r := call(t, s, "GET", "/ping", a.token, nil)
	require.Equal(t, http.StatusOK, r.status, "ping: %s", r.body)
	var p pingResult
	r.json(t, &p)
	return p
}

type acceptedJob struct {
	ID                 string            `json:"id"`
	State              string            `json:"state"`
	Token              string            `json:"token"`
	Env                map[string]string `json:"env"`
	ChunksMaxSizeBytes int64             `json:"chunks_max_size_bytes"`
	Step               json.RawMessage   `json:"step"`
}

// takeJob pings until a job is offered, accepts it and returns it.
func takeJob(t *testing.T, s *Server, a testAgent) acceptedJob {
	t.Helper()
	p := ping(t, s, a)
	require.NotNil(t, p.Job, "ping offered no job")
	r := call(t, s, "PUT", "/jobs/"+p.Job.ID+"/accept", a.token, nil)
	require.Equal(t, http.StatusOK, r.status, "accept: %s", r.body)
	var j acceptedJob
	r.json(t, &j)
	return j
}

// startedJob makes a one-step build, takes its job with a new agent and starts it.
func startedJob(t *testing.T, s *Server, yaml string) (testAgent, acceptedJob) {
	t.Helper()
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: yaml, Repo: "https://example.invalid/repo.git"})
	require.NoError(t, err)
	a := registerAgent(t, s, "unit", "queue=default")
	j := takeJob(t, s, a)
	r := call(t, s, "PUT", "/jobs/"+j.ID+"/start", j.Token, map[string]string{"started_at": time.Now().Format(time.RFC3339Nano)})
	require.Equal(t, http.StatusOK, r.status, "start: %s", r.body)
	return a, j
}

func waitJob(t *testing.T, s *Server, id string, cond func(JobSnapshot) bool) JobSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	j, err := s.WaitJob(ctx, id, cond)
	require.NoError(t, err)
	return j
}
