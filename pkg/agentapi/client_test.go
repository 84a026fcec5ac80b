package agentapi

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/buildkite/agent/v3/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// server answers each request with the next status of statuses (the last one repeats),
// recording the calls.
func server(t *testing.T, statuses []int, header http.Header, body string) (*httptest.Server, *atomic.Int32, *atomic.Value) {
	t.Helper()
	var n atomic.Int32
	var auth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		auth.Store(r.Header.Get("Authorization"))
		status := statuses[min(i, len(statuses)-1)]
		for k, v := range header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		if status >= 400 {
			_, _ = io.WriteString(w, `{"message":"nope"}`)
			return
		}
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &n, &auth
}

func TestRetryRules(t *testing.T) {
	cases := []struct {
		name      string
		statuses  []int
		header    http.Header
		call      func(*Client) error
		wantCalls int32
		wantCode  int
	}{
		{"heartbeat retries 5xx", []int{502, 503, 200}, nil,
			func(c *Client) error { return c.Heartbeat(context.Background()) }, 3, 0},
		{"heartbeat retries 429 honouring Retry-After", []int{429, 200}, http.Header{"Retry-After": {"1"}},
			func(c *Client) error { return c.Heartbeat(context.Background()) }, 2, 0},
		{"heartbeat stops on 401", []int{401, 200}, nil,
			func(c *Client) error { return c.Heartbeat(context.Background()) }, 1, 401},
		{"accept is not retried on a status", []int{500, 200}, nil,
			func(c *Client) error { _, err := c.Accept(context.Background(), "j"); return err }, 1, 500},
		{"accept 422 means taken", []int{422}, nil,
			func(c *Client) error { _, err := c.Accept(context.Background(), "j"); return err }, 1, 422},
		{"ping is never retried", []int{503, 200}, nil,
			func(c *Client) error { _, err := c.Ping(context.Background()); return err }, 1, 503},
		{"finish gives up on 422", []int{422}, nil,
			func(c *Client) error { return c.Finish(context.Background(), "j", Finish{ExitStatus: 3}) }, 1, 422},
		{"finish retries 5xx", []int{500, 500, 200}, nil,
			func(c *Client) error { return c.Finish(context.Background(), "j", Finish{ExitStatus: 3}) }, 3, 0},
		{"start retries 429 then gives up after its attempts", []int{429}, nil,
			func(c *Client) error { return c.Start(context.Background(), "j", time.Now()) }, 7, 429},
		{"a chunk is retried on 5xx", []int{502, 503, 201}, nil,
			func(c *Client) error { return c.UploadChunk(context.Background(), "j", 1, 0, []byte("x\n")) }, 3, 0},
		{"a refused chunk is not retried", []int{422, 201}, nil,
			func(c *Client) error { return c.UploadChunk(context.Background(), "j", 1, 0, []byte("x\n")) }, 1, 422},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, calls, auth := server(t, tc.statuses, tc.header, `{"action":"idle","state":"running","id":"j"}`)
			c := New(Config{Endpoint: srv.URL + "/v3", Token: "secret-token", WaitScale: 0.001})
			err := tc.call(c)
			assert.Equal(t, tc.wantCalls, calls.Load(), "calls made")
			assert.Equal(t, "Token secret-token", auth.Load())
			if tc.wantCode == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, tc.wantCode, StatusCode(err))
			assert.NotContains(t, err.Error(), "secret-token", "errors must never carry the token")
		})
	}
}

func TestNetworkErrorsAreRetried(t *testing.T) {
	// A listener that is closed refuses connections: accept retries those.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := New(Config{Endpoint: url + "/v3", Token: "t", WaitScale: 0.0001})
	_, err := c.Accept(context.Background(), "j")
	require.Error(t, err)
	assert.Equal(t, 0, StatusCode(err))
	assert.False(t, IsPermanent(err))
}

// The clients derived from one New share its HTTP clients (a slot's or a job's client
// costs a few words), and each request still carries its own client's token and goes to
// its own endpoint, however many are made at once.
func TestDerivedClientsSendTheirOwnTokens(t *testing.T) {
	type seen struct{ server, path, auth string }
	var mu sync.Mutex
	got := map[seen]int{}
	handler := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[seen{name, r.URL.Path, r.Header.Get("Authorization")}]++
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{}`)
		})
	}
	one, other := httptest.NewServer(handler("one")), httptest.NewServer(handler("other"))
	defer one.Close()
	defer other.Close()

	base := New(Config{Endpoint: one.URL + "/v3", Token: "registration"})
	a, b := base.WithToken("agent-a"), base.WithToken("agent-b")
	job := a.WithEndpoint(other.URL + "/v3").WithToken("job-j")
	for _, c := range []*Client{a, b, job} {
		assert.Same(t, base.calls, c.calls, "a derived client makes its own HTTP clients")
	}

	const n = 20
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { assert.NoError(t, a.Heartbeat(context.Background())) })
		wg.Go(func() { assert.NoError(t, b.Heartbeat(context.Background())) })
		wg.Go(func() { assert.NoError(t, job.UploadChunk(context.Background(), "j", 1, 0, []byte("x"))) })
		wg.Go(func() { _, err := job.JobState(context.Background(), "j"); assert.NoError(t, err) })
	}
	wg.Wait()
	_, err := base.Register(context.Background(), &api.AgentRegisterRequest{Name: "r"})
	require.NoError(t, err)

	assert.Equal(t, map[seen]int{
		{"one", "/v3/heartbeat", "Token agent-a"}:     n,
		{"one", "/v3/heartbeat", "Token agent-b"}:     n,
		{"other", "/v3/jobs/j/chunks", "Token job-j"}: n,
		{"other", "/v3/jobs/j", "Token job-j"}:        n,
		{"one", "/v3/register", "Token registration"}: 1,
	}, got)
}

func TestUploadChunkSendsGzipWithSequenceAndOffset(t *testing.T) {
	var got struct {
		seq, off, size string
		body           string
		encoding       string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		got.seq, got.off, got.size = q.Get("sequence"), q.Get("offset"), q.Get("size")
		got.encoding = r.Header.Get("Content-Encoding")
		zr, err := gzip.NewReader(r.Body)
		if err == nil {
			b, _ := io.ReadAll(zr)
			got.body = string(b)
		}
		w.WriteHeader(201)
	}))
	defer srv.Close()
	c := New(Config{Endpoint: srv.URL + "/v3", Token: "bkaj_x"})
	data := "hello\nworld\n"
	require.NoError(t, c.UploadChunk(context.Background(), "job-1", 2, 100, []byte(data)))
	assert.Equal(t, "2", got.seq)
	assert.Equal(t, "100", got.off)
	assert.Equal(t, strconv.Itoa(len(data)), got.size)
	assert.Equal(t, "gzip", got.encoding)
	assert.Equal(t, data, got.body)
}

// A Retry-After header sets the wait before the next attempt, but no server may make a
// caller wait longer than MaxRetryAfter: an outage that answers "come back in an hour"
// would otherwise hold the caller (and whatever it holds) for that hour.
func TestRetryAfterIsCapped(t *testing.T) {
	p := Policy{Attempts: 3, Wait: 2 * time.Second}
	cases := []struct {
		name       string
		retryAfter string
		want       time.Duration
	}{
		{"no header: the policy's wait", "", 2 * time.Second},
		{"a short Retry-After is obeyed", "7", 7 * time.Second},
		{"zero means at once", "0", 0},
		{"a long Retry-After is capped", "3600", MaxRetryAfter},
		{"just over the cap is capped", strconv.Itoa(int(MaxRetryAfter/time.Second) + 1), MaxRetryAfter},
		{"one that would overflow a Duration is capped", "99999999999999", MaxRetryAfter},
		{"a negative one is ignored", "-5", 2 * time.Second},
		{"a date is not understood: the policy's wait", "Wed, 21 Oct 2026 07:28:00 GMT", 2 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}}
			if tc.retryAfter != "" {
				resp.Header.Set("Retry-After", tc.retryAfter)
			}
			assert.Equal(t, tc.want, backoff(p, 1, resp))
		})
	}

	// End to end: a server that asks for an hour between attempts is retried after
	// the cap (scaled down here), not after the hour.
	srv, calls, _ := server(t, []int{429, 200}, http.Header{"Retry-After": {"3600"}}, `{}`)
	c := New(Config{Endpoint: srv.URL + "/v3", Token: "t", WaitScale: 0.001})
	began := time.Now()
	require.NoError(t, c.Heartbeat(context.Background()))
	assert.Equal(t, int32(2), calls.Load())
	assert.Less(t, time.Since(began), time.Second, "the hour asked for (3.6 s at this scale) was obeyed")
}

// Chunks share gzip writers and buffers (chunks.go): each upload, retries and concurrent
// uploads included, must still send exactly its own bytes, and a refusal must read as
// api.Client's would, Buildkite's message or a proxy's page included.
func TestUploadChunkBodiesAndRefusals(t *testing.T) {
	type got struct {
		path, query, body string
	}
	var (
		mu       sync.Mutex
		received []got
		attempts atomic.Int32
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		zr, err := gzip.NewReader(r.Body)
		require.NoError(t, err)
		body, err := io.ReadAll(zr)
		require.NoError(t, err)
		mu.Lock()
		received = append(received, got{r.URL.EscapedPath(), r.URL.RawQuery, string(body)})
		mu.Unlock()
		switch {
		case strings.HasPrefix(string(body), "fail-once") && attempts.Add(1) == 1:
			w.WriteHeader(http.StatusBadGateway)
		case strings.HasPrefix(string(body), "refuse"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"message":"Chunk too large"}`)
		case strings.HasPrefix(string(body), "proxy"):
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, "<html>denied by the proxy</html>")
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	c := New(Config{Endpoint: srv.URL + "/v3/", Token: "bkaj_secret", WaitScale: 0.001})
	ctx := context.Background()

	// Concurrent uploads of different sizes, so that the pooled writers and buffers are
	// passed from one to another while others are in flight.
	var wg sync.WaitGroup
	want := map[string]bool{}
	for i := range 40 {
		data := strings.Repeat(fmt.Sprintf("line %d of chunk %d\n", i, i), 1+i*300)
		want[data] = true
		wg.Go(func() { assert.NoError(t, c.UploadChunk(ctx, "job-1", uint64(i+1), 0, []byte(data))) })
	}
	wg.Wait()
	mu.Lock()
	for _, g := range received {
		assert.True(t, want[g.body], "a body that was not sent: %.40q", g.body)
		delete(want, g.body)
	}
	received = nil
	mu.Unlock()
	assert.Empty(t, want, "chunks that did not arrive")

	// A retry sends the whole chunk again.
	require.NoError(t, c.UploadChunk(ctx, "job.2", 7, 1000, []byte("fail-once then succeed\n")))
	require.Len(t, received, 2)
	for _, g := range received {
		assert.Equal(t, got{"/v3/jobs/job%2E2/chunks", "sequence=7&offset=1000&size=23", "fail-once then succeed\n"}, g,
			"the dot is escaped as the agent escapes it, for Rails")
	}

	err := c.UploadChunk(ctx, "job-3", 1, 0, []byte("refuse me"))
	require.Error(t, err)
	assert.Equal(t, http.StatusUnprocessableEntity, StatusCode(err))
	assert.True(t, IsPermanent(err))
	assert.Contains(t, err.Error(), "Chunk too large")
	assert.Contains(t, err.Error(), "uploading log chunk 1 of job job-3")
	assert.NotContains(t, err.Error(), "bkaj_secret")

	err = c.UploadChunk(ctx, "job-3", 2, 9, []byte("proxy"))
	assert.Equal(t, http.StatusForbidden, StatusCode(err))
	assert.Contains(t, err.Error(), "denied by the proxy")
}
