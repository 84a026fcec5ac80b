package fakebuildkite

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// StartForTest starts a fake that logs to t and closes when the test ends.
func StartForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("start the fake Buildkite: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// AcceptedJob is the part of accept's Job that tests which run a job themselves need.
type AcceptedJob struct {
	ID                 string            `json:"id"`
	Token              string            `json:"token"`
	Env                map[string]string `json:"env"`
	ChunksMaxSizeBytes uint64            `json:"chunks_max_size_bytes"`
}

// AcceptJobForTest takes a job the way an agent does, for tests that play the agent's part
// after accept: it registers an agent with name and tags, connects it, pings until a job is
// offered and accepts it. The calls go over the agent API so that the fake's request log and
// agent records are an agent's. Create the build first; no job within 30 seconds fails t.
func (s *Server) AcceptJobForTest(t testing.TB, name string, tags ...string) AcceptedJob {
	t.Helper()
	var reg struct {
		AccessToken string `json:"access_token"`
	}
	s.callForTest(t, http.MethodPost, "/register", s.RegistrationToken(), registerRequest{Name: name, MetaData: tags}, &reg)
	s.callForTest(t, http.MethodPost, "/connect", reg.AccessToken, nil, nil)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var p struct {
			Job *struct {
				ID string `json:"id"`
			} `json:"job"`
		}
		s.callForTest(t, http.MethodGet, "/ping", reg.AccessToken, nil, &p)
		if p.Job != nil {
			var j AcceptedJob
			s.callForTest(t, http.MethodPut, "/jobs/"+p.Job.ID+"/accept", reg.AccessToken, nil, &j)
			return j
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fake Buildkite offered agent %q (tags %v) no job in 30s: create a build whose steps match those tags first", name, tags)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// callForTest makes one agent API call and decodes its 2xx answer into out (when not nil).
// The token is sent, never logged: only the path, status and error message are.
func (s *Server) callForTest(t testing.TB, method, path, token string, body, out any) {
	t.Helper()
	status, _, data := s.requestForTest(t, method, path, token, body)
	if status/100 != 2 {
		t.Fatalf("%s %s: %d %s: %s", method, path, status, http.StatusText(status), data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode the answer: %v", method, path, err)
		}
	}
}

// requestForTest makes one agent API request and returns the answer, whatever its status.
// path is under the agent endpoint unless it is a whole URL; token goes in
// "Authorization: Token <token>" (no header when empty); body is sent as it is when it is
// []byte, as JSON otherwise, and not at all when nil.
func (s *Server) requestForTest(t testing.TB, method, path, token string, body any) (status int, header http.Header, data []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encode %s %s: %v", method, path, err)
		}
		rd = bytes.NewReader(js)
	}
	url := path
	if !strings.HasPrefix(path, "http") {
		url = s.Endpoint() + path
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Token "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the answer: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, data
}

// testClient bounds a test's request, so that a fake that stopped answering fails the test
// rather than hanging it.
var testClient = &http.Client{Timeout: time.Minute}
