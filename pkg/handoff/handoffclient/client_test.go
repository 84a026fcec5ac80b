package handoffclient_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
)

// TestLinksNoKubernetes: the supervisor imports this package, and its binary must stay
// free of the Kubernetes packages (see cmd/agentd-supervise).
func TestLinksNoKubernetes(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "net/http", "go list -deps lists the package's imports")
	for _, pkg := range deps {
		for _, heavy := range []string{"k8s.io/", "sigs.k8s.io/", "github.com/prometheus/", "buildkite-operator/pkg/apis/"} {
			assert.NotContains(t, pkg, heavy, "handoffclient links %s", pkg)
		}
		assert.NotEqual(t, "github.com/buildkite-operator/buildkite-operator/pkg/handoff", pkg, "the wire types live here so that the server imports the client, not the other way round")
	}
}

func TestJobPrintsNoSecrets(t *testing.T) {
	job := handoffclient.Job{ID: "job-1", BuildJob: "bj-1", Token: "sekrit-token", Env: map[string]string{"API_KEY": "sekrit-env"}}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("job", "job", job)
	for _, s := range []string{fmt.Sprint(job), fmt.Sprintf("%+v", job), fmt.Sprintf("%#v", job), fmt.Sprintf("%s", job), fmt.Errorf("x: %v", job).Error(), logged.String()} {
		assert.Contains(t, s, "job-1")
		assert.NotContains(t, s, "sekrit")
	}
	wire, err := json.Marshal(job)
	require.NoError(t, err)
	assert.Contains(t, string(wire), "sekrit-token", "the wire form carries the token")
}

// server is a scripted endpoint: it answers each request with the next of its answers
// and records the bearer tokens it was sent.
type server struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter)
	tokens  []string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.tokens = append(s.tokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	n := len(s.tokens) - 1
	s.mu.Unlock()
	if r.Method != http.MethodPost {
		http.Error(w, "not a POST", http.StatusMethodNotAllowed)
		return
	}
	if n >= len(s.answers) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	s.answers[n](w)
}

func (s *server) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tokens...)
}

func status(code int, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
	}
}

func refusal(code int, reason string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(handoffclient.ErrorResponse{Reason: reason, Message: "because " + reason})
	}
}

func sendJob(job handoffclient.Job) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) { _ = json.NewEncoder(w).Encode(job) }
}

// start serves s over TLS and returns a client for it with the server's CA in a file.
func start(t *testing.T, s http.Handler, token string) (*handoffclient.Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewUnstartedServer(s)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	tokenPath := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenPath, []byte(token+"\n"), 0o600))
	return &handoffclient.Client{URL: srv.URL + "/handoff", TokenPath: tokenPath, CAPath: ca, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}, srv
}

// rotate replaces the token file as the kubelet does: a new file renamed over the old.
func rotate(t *testing.T, path, token string) {
	t.Helper()
	tmp := path + ".new"
	require.NoError(t, os.WriteFile(tmp, []byte(token), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

func TestFetch(t *testing.T) {
	job := handoffclient.Job{ID: "0190-job", BuildJob: "bj", Command: "make test", Env: map[string]string{"A": "1"}, Token: "job-token"}
	for _, tc := range []struct {
		name    string
		answers []func(w http.ResponseWriter)
		// wantErr, when set, is in the error; else the job is expected.
		wantErr  string
		attempts int
	}{
		{name: "job at once", answers: []func(http.ResponseWriter){sendJob(job)}, attempts: 1},
		{name: "through 204s, 5xx and 429", answers: []func(http.ResponseWriter){
			status(http.StatusNoContent, "0"), status(http.StatusServiceUnavailable, "0"), status(http.StatusBadGateway, ""),
			status(http.StatusTooManyRequests, ""), status(http.StatusNoContent, ""), sendJob(job),
		}, attempts: 6},
		{name: "unknown pod is final", answers: []func(http.ResponseWriter){status(http.StatusNoContent, ""), refusal(http.StatusForbidden, handoffclient.ReasonUnknownPod)},
			wantErr: "HTTP 403 UnknownPod): because UnknownPod", attempts: 2},
		{name: "second hand-off is final", answers: []func(http.ResponseWriter){refusal(http.StatusConflict, handoffclient.ReasonAlreadyHandedOff)},
			wantErr: "HTTP 409 AlreadyHandedOff", attempts: 1},
		{name: "bad token is final", answers: []func(http.ResponseWriter){refusal(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
			wantErr: "HTTP 401 Unauthenticated", attempts: 1},
		{name: "a redirect is not followed", answers: []func(http.ResponseWriter){func(w http.ResponseWriter) {
			w.Header().Set("Location", "https://elsewhere.example/")
			w.WriteHeader(http.StatusTemporaryRedirect)
		}}, wantErr: "HTTP 307", attempts: 1},
		{name: "an unreadable job is final", answers: []func(http.ResponseWriter){func(w http.ResponseWriter) { _, _ = w.Write([]byte("{not json")) }},
			wantErr: "cannot be fetched again", attempts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &server{answers: tc.answers}
			c, _ := start(t, s, "pod-token")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := c.Fetch(ctx)
			assert.Len(t, s.seen(), tc.attempts)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				var refused *handoffclient.RefusedError
				assert.ErrorAs(t, err, &refused, "a refusal retrying cannot change")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, job, got)
			for _, tok := range s.seen() {
				assert.Equal(t, "pod-token", tok, "the token file's content, trimmed")
			}
		})
	}
}

// TestFetchRereadsTheToken: the kubelet rotates the projected token; each attempt sends
// the file's current content.
func TestFetchRereadsTheToken(t *testing.T) {
	var c *handoffclient.Client
	s := &server{}
	s.answers = []func(http.ResponseWriter){
		func(w http.ResponseWriter) {
			rotate(t, c.TokenPath, "second-token")
			w.WriteHeader(http.StatusNoContent)
		},
		func(w http.ResponseWriter) {
			rotate(t, c.TokenPath, "third-token")
			w.WriteHeader(http.StatusServiceUnavailable)
		},
		sendJob(handoffclient.Job{ID: "j", Token: "t"}),
	}
	c, _ = start(t, s, "first-token")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	job, err := c.Fetch(ctx)
	require.NoError(t, err)
	assert.Equal(t, "j", job.ID)
	assert.Equal(t, []string{"first-token", "second-token", "third-token"}, s.seen())
}

func TestFetchGivesUpWhenTheContextEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup breaks the client or the server.
		setup   func(t *testing.T, c *handoffclient.Client, srv *httptest.Server)
		wantErr string
	}{
		{name: "never assigned", setup: func(*testing.T, *handoffclient.Client, *httptest.Server) {}, wantErr: "the pod was not assigned a job yet"},
		{name: "server down", setup: func(_ *testing.T, _ *handoffclient.Client, srv *httptest.Server) { srv.Close() }, wantErr: "connect"},
		{name: "untrusted certificate", setup: func(t *testing.T, c *handoffclient.Client, _ *httptest.Server) {
			// Every httptest server has the same certificate: make another CA.
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			require.NoError(t, err)
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"}, IsCA: true,
				BasicConstraintsValid: true, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(c.CAPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
		}, wantErr: "certificate"},
		{name: "no token file", setup: func(t *testing.T, c *handoffclient.Client, _ *httptest.Server) {
			require.NoError(t, os.Remove(c.TokenPath))
		}, wantErr: "reading the pod's ServiceAccount token"},
		{name: "CA bundle without certificates", setup: func(t *testing.T, c *handoffclient.Client, _ *httptest.Server) {
			require.NoError(t, os.WriteFile(c.CAPath, []byte("nothing"), 0o600))
		}, wantErr: "holds no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv := start(t, &server{}, "tok")
			tc.setup(t, c, srv)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := c.Fetch(ctx)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestFetchRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		c       *handoffclient.Client
		wantErr string
	}{
		{name: "plain http", c: &handoffclient.Client{URL: "http://operator.ns.svc/handoff", TokenPath: "/t"}, wantErr: "must be an https:// URL"},
		{name: "no host", c: &handoffclient.Client{URL: "https:///handoff", TokenPath: "/t"}, wantErr: "must be an https:// URL"},
		{name: "no token path", c: &handoffclient.Client{URL: "https://operator.ns.svc/handoff"}, wantErr: "no token file given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.Fetch(context.Background())
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// TestFetchReconnectsAfterA5xx: behind a Service, a new connection may reach another
// replica; a replica that cannot answer (not ready, not the leader) must not hold the pod
// on a kept-alive connection, while a "not yet" keeps it.
func TestFetchReconnectsAfterA5xx(t *testing.T) {
	s := &server{answers: []func(http.ResponseWriter){
		status(http.StatusServiceUnavailable, "0"), status(http.StatusNoContent, ""), status(http.StatusNoContent, ""), sendJob(handoffclient.Job{ID: "j"}),
	}}
	srv := httptest.NewUnstartedServer(s)
	var mu sync.Mutex
	conns := 0
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c, _ := start(t, http.NotFoundHandler(), "tok")
	c.URL = srv.URL
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Fetch(ctx)
	require.NoError(t, err)
	assert.Len(t, s.seen(), 4)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 2, conns, "one connection before the 503, one after it for the rest")
}
