package handoffclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults for the Client's zero fields.
const (
	DefaultMinBackoff = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
	// DefaultAttemptTimeout outlasts the endpoint's long poll (30 s by default), so that an
	// attempt ends with the server's answer, not the client's impatience.
	DefaultAttemptTimeout = 60 * time.Second
	// maxTokenBytes bounds the token file read: projected tokens are a few KiB.
	maxTokenBytes = 64 << 10
	// maxErrorBytes bounds a refusal's body read.
	maxErrorBytes = 16 << 10
)

// Client asks the operator's hand-off endpoint for this pod's job.
type Client struct {
	// URL is the endpoint, https only: the request carries the pod's token.
	URL string
	// TokenPath is the projected ServiceAccount token's file. It is read at every attempt,
	// because the kubelet replaces it before it expires.
	TokenPath string
	// CAPath is a PEM bundle of the CAs that sign the endpoint's serving certificate; empty
	// means the system's roots. It too is read again when an attempt fails, so a rotated CA
	// is picked up.
	CAPath string

	// MinBackoff and MaxBackoff bound the wait between failed attempts.
	MinBackoff, MaxBackoff time.Duration
	// AttemptTimeout bounds one request, long poll included.
	AttemptTimeout time.Duration
	// Logf, when set, is told of each failed attempt (never of the token or the job).
	Logf func(format string, args ...any)

	mu     sync.Mutex
	caPEM  []byte
	client *http.Client
}

// RefusedError is a refusal that retrying cannot change: the pod is not the one the job
// was assigned to, its token was not accepted, or its job was already handed off.
type RefusedError struct {
	Status  int
	Reason  string
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the operator refused to hand off a job to this pod (HTTP %d %s): %s", e.Status, e.Reason, e.Message)
}

// Fetch returns this pod's job, waiting for it to be assigned and retrying what may pass
// (connection errors, 5xx, 429, "not yet" answers) until ctx ends. A refusal comes back at
// once as a *RefusedError.
func (c *Client) Fetch(ctx context.Context) (Job, error) {
	u, err := url.Parse(c.URL)
	if err != nil {
		return Job{}, fmt.Errorf("hand-off endpoint %q: %w", c.URL, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return Job{}, fmt.Errorf("hand-off endpoint %q: must be an https:// URL, because the request carries the pod's ServiceAccount token", c.URL)
	}
	if c.TokenPath == "" {
		return Job{}, errors.New("hand-off: no token file given: mount a projected ServiceAccount token with the endpoint's audience and give its path")
	}
	minB, maxB := orDefault(c.MinBackoff, DefaultMinBackoff), orDefault(c.MaxBackoff, DefaultMaxBackoff)
	failures := 0
	// lastErr is what went wrong last before ctx ended: an attempt cut short by ctx itself
	// says nothing about why no job came.
	var lastErr error
	giveUp := func(err error) (Job, error) {
		if lastErr == nil {
			lastErr = err
		}
		return Job{}, fmt.Errorf("no job handed off by %s: %w (last attempt: %w)", c.URL, ctx.Err(), lastErr)
	}
	for {
		job, wait, err := c.attempt(ctx)
		var refused *RefusedError
		switch {
		case err == nil && wait < 0:
			return job, nil
		case errors.As(err, &refused):
			return Job{}, err
		case ctx.Err() != nil:
			return giveUp(err)
		case err != nil:
			lastErr = err
			failures++
			if wait == 0 {
				wait = backoff(minB, maxB, failures)
			}
			c.logf("hand-off attempt %d failed, retrying in %s: %v", failures, wait.Round(time.Millisecond), err)
		default:
			// Not assigned yet: the server held the request as long as it would, so the
			// next one can go soon; failures do not pile up on waiting.
			lastErr = errNotYet
			failures = 0
			if wait == 0 {
				wait = minB
			}
		}
		t := time.NewTimer(min(wait, maxB))
		select {
		case <-ctx.Done():
			t.Stop()
			return giveUp(nil)
		case <-t.C:
		}
	}
}

var errNotYet = errors.New("the pod was not assigned a job yet")

// attempt makes one request. It returns the job with wait < 0 on success; wait >= 0 with a
// nil error when the pod has no job yet; an error otherwise, with the server's Retry-After
// as wait when it gave one.
func (c *Client) attempt(ctx context.Context) (Job, time.Duration, error) {
	token, err := readToken(c.TokenPath)
	if err != nil {
		return Job{}, 0, err
	}
	hc, err := c.httpClient()
	if err != nil {
		return Job{}, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(c.AttemptTimeout, DefaultAttemptTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, http.NoBody)
	if err != nil {
		return Job{}, 0, fmt.Errorf("hand-off request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		// The CA may have rotated: read it again before the next attempt.
		c.forgetClient()
		return Job{}, 0, fmt.Errorf("hand-off request to %s: %w", c.URL, err)
	}
	forget := false
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBytes))
		_ = resp.Body.Close()
		if forget {
			c.forgetClient()
		}
	}()
	retryAfter := parseRetryAfter(resp.Header.Get("Retry-After"))
	switch {
	case resp.StatusCode == http.StatusOK:
		var job Job
		dec := json.NewDecoder(io.LimitReader(resp.Body, MaxJobBytes))
		if err := dec.Decode(&job); err != nil {
			// The server has handed the job off already: it cannot be asked for again.
			return Job{}, 0, &RefusedError{Status: resp.StatusCode, Reason: "BadResponse", Message: fmt.Sprintf("the job's hand-off could not be read (%v); it cannot be fetched again", err)}
		}
		return job, -1, nil
	case resp.StatusCode == http.StatusNoContent:
		return Job{}, retryAfter, nil
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		// A new connection may reach another replica behind the Service: one that is
		// not ready (not the leader, say) must not keep this pod for good.
		forget = true
		return Job{}, retryAfter, fmt.Errorf("hand-off endpoint answered HTTP %d: %s", resp.StatusCode, readMessage(resp.Body))
	default:
		e := &RefusedError{Status: resp.StatusCode}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
		var er ErrorResponse
		if json.Unmarshal(body, &er) == nil && er.Message != "" {
			e.Reason, e.Message = er.Reason, er.Message
		} else {
			e.Reason, e.Message = http.StatusText(resp.StatusCode), strings.TrimSpace(string(body))
		}
		return Job{}, 0, e
	}
}

func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading the pod's ServiceAccount token: %w", err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
	if err != nil {
		return "", fmt.Errorf("reading the pod's ServiceAccount token %s: %w", path, err)
	}
	if len(b) > maxTokenBytes {
		return "", fmt.Errorf("the ServiceAccount token file %s is larger than %d bytes: is it a token?", path, maxTokenBytes)
	}
	token := string(bytes.TrimSpace(b))
	if token == "" {
		return "", fmt.Errorf("the ServiceAccount token file %s is empty", path)
	}
	return token, nil
}

// httpClient returns a client trusting the CA bundle's current content.
func (c *Client) httpClient() (*http.Client, error) {
	var pem []byte
	if c.CAPath != "" {
		var err error
		if pem, err = os.ReadFile(c.CAPath); err != nil {
			return nil, fmt.Errorf("reading the hand-off endpoint's CA bundle: %w", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil && bytes.Equal(pem, c.caPEM) {
		return c.client, nil
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAPath != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the hand-off endpoint's CA bundle %s holds no PEM certificate", c.CAPath)
		}
		tlsConfig.RootCAs = pool
	}
	if c.client != nil {
		c.client.CloseIdleConnections()
	}
	c.caPEM = pem
	c.client = &http.Client{
		// No proxy: the endpoint is in the cluster, and a job image's HTTPS_PROXY is for
		// the job's traffic, not for the pod's token.
		Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: true, IdleConnTimeout: 90 * time.Second},
		// A redirect would carry the token elsewhere: a 3xx is a refusal.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c.client, nil
}

func (c *Client) forgetClient() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		c.client.CloseIdleConnections()
		c.client = nil
	}
}

func (c *Client) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

func readMessage(r io.Reader) string {
	body, _ := io.ReadAll(io.LimitReader(r, maxErrorBytes))
	var er ErrorResponse
	if json.Unmarshal(body, &er) == nil && er.Message != "" {
		return er.Message
	}
	return strings.TrimSpace(string(body))
}

// parseRetryAfter reads a Retry-After in seconds; dates and nonsense count as none.
func parseRetryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// backoff is the wait after the n-th failure in a row: doubling from minB up to maxB, with
// jitter so that a pool of warm pods does not retry in step after an operator restart.
func backoff(minB, maxB time.Duration, n int) time.Duration {
	d := minB
	for i := 1; i < n && d < maxB; i++ {
		d *= 2
	}
	d = min(d, maxB)
	return d/2 + rand.N(d/2+1)
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
