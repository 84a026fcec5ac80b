package soak

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProxy: requests go through; a cut ends a long-lived response (a watch) at once; an
// outage holds requests back for its length; delays happen and are counted.
func TestProxy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/watch" {
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "event\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	p, err := StartProxy(srv.Listener.Addr().String(), ProxyConfig{DelayProbability: 0.5, MaxDelay: 20 * time.Millisecond, Seed: 1})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	base := "http://" + p.Addr()

	for i := range 10 {
		// A new connection each time, so that connection delays are drawn too.
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
		resp, err := c.Get(base + "/")
		require.NoError(t, err, "request %d", i)
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, "ok", string(body))
	}
	delays, _, _ := p.Counts()
	assert.Positive(t, delays, "some requests were delayed")

	resp, err := http.Get(base + "/watch")
	require.NoError(t, err)
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "event\n", line)
	ended := make(chan error, 1)
	go func() { _, err := r.ReadString('\n'); ended <- err }()
	assert.Eventually(t, p.CutOne, 5*time.Second, 10*time.Millisecond, "an open connection to cut")
	select {
	case err := <-ended:
		assert.Error(t, err, "the watch ends with an error when its connection is cut")
	case <-time.After(5 * time.Second):
		t.Fatal("the watch went on after its connection was cut")
	}
	_ = resp.Body.Close()

	t0 := time.Now()
	go p.Outage(300 * time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err = c.Get(base + "/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.GreaterOrEqual(t, time.Since(t0), 300*time.Millisecond, "a request waits out the outage")
	_, cuts, outages := p.Counts()
	assert.Positive(t, cuts)
	assert.Equal(t, int64(1), outages)
}
