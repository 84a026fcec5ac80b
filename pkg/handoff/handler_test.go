package handoff_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Run(m, &env) }

const audience = "buildkite-operator-handoff"

// fixture is a namespace with the warm pods' ServiceAccount, in the real API server.
type fixture struct {
	t  *testing.T
	ns string
	sa *corev1.ServiceAccount
}

var nsSeq struct {
	sync.Mutex
	n int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	nsSeq.Lock()
	nsSeq.n++
	name := fmt.Sprintf("handoff-%d", nsSeq.n)
	nsSeq.Unlock()
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "warm"}}
	require.NoError(t, env.Client.Create(ctx, sa))
	return &fixture{t: t, ns: name, sa: sa}
}

// pod creates a warm pod; no kubelet runs it, it only has to exist.
func (f *fixture) pod(name string) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: corev1.PodSpec{
			ServiceAccountName: f.sa.Name,
			Containers:         []corev1.Container{{Name: "job", Image: "busybox"}},
		},
	}
	require.NoError(f.t, env.Client.Create(context.Background(), p))
	return p
}

// token mints a token of the ServiceAccount with the TokenRequest API, as the kubelet does
// for a projected volume: bound to the pod when one is given.
func (f *fixture) token(pod *corev1.Pod, audiences ...string) string {
	f.t.Helper()
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To[int64](3600)}}
	if pod != nil {
		tr.Spec.BoundObjectRef = &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	require.NoError(f.t, env.Client.SubResource("token").Create(context.Background(), f.sa, tr))
	require.NotEmpty(f.t, tr.Status.Token)
	return tr.Status.Token
}

func jobFor(name string) handoffclient.Job {
	return handoffclient.Job{ID: "job-" + name, BuildJob: "bj-" + name, Command: "make test",
		Env: map[string]string{"SECRET_" + name: "env-secret-" + name}, Token: "job-token-" + name}
}

// logBuffer collects the handler's log lines, to show that no secret reaches them.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.b.WriteString(prefix + args + "\n")
	}, funcr.Options{Verbosity: 10})
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve serves a handler over TLS.
func serve(t *testing.T, cfg handoff.Config) *httptest.Server {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = env.Client
	}
	if cfg.Audience == "" {
		cfg.Audience = audience
	}
	h, err := handoff.NewHandler(cfg)
	require.NoError(t, err)
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status int
	reason string
	job    *handoffclient.Job
	header http.Header
}

func post(t *testing.T, srv *httptest.Server, token string) answer {
	t.Helper()
	return request(t, srv, http.MethodPost, "Bearer "+token, nil)
}

func request(t *testing.T, srv *httptest.Server, method, authorization string, body io.Reader) answer {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL, body)
	require.NoError(t, err)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{status: resp.StatusCode, header: resp.Header}
	switch resp.StatusCode {
	case http.StatusOK:
		a.job = &handoffclient.Job{}
		require.NoError(t, json.Unmarshal(raw, a.job))
	case http.StatusNoContent:
		assert.Empty(t, raw)
	default:
		var er handoffclient.ErrorResponse
		require.NoError(t, json.Unmarshal(raw, &er), "a refusal is JSON: %s", raw)
		assert.NotEmpty(t, er.Message)
		a.reason = er.Reason
	}
	return a
}

func refused(status int, reason string) answer { return answer{status: status, reason: reason} }
func handed(job handoffclient.Job) answer      { return answer{status: http.StatusOK, job: &job} }

func assertAnswer(t *testing.T, want, got answer, msgAndArgs ...any) {
	t.Helper()
	assert.Equal(t, want.status, got.status, msgAndArgs...)
	assert.Equal(t, want.reason, got.reason, msgAndArgs...)
	assert.Equal(t, want.job, got.job, msgAndArgs...)
}

// TestHandOff goes through the real API server: real tokens, bound to real pods, checked
// by real TokenReviews.
func TestHandOff(t *testing.T) {
	type step struct {
		name string
		// token is what the step presents.
		token func(s *scene) string
		want  answer
	}
	for _, tc := range []struct {
		name string
		// setup makes the pods and the registry's state.
		setup func(s *scene)
		steps []step
		// after checks the registry afterwards.
		after func(t *testing.T, s *scene)
	}{
		{
			name:  "the assigned pod gets its job once",
			setup: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a"))) },
			steps: []step{
				{name: "hand-off", token: func(s *scene) string { return s.tokA }, want: handed(jobFor("a"))},
				{name: "the same token again", token: func(s *scene) string { return s.tokA }, want: refused(http.StatusConflict, handoffclient.ReasonAlreadyHandedOff)},
				{name: "a new token of the same pod", token: func(s *scene) string { return s.f.token(s.a, audience) }, want: refused(http.StatusConflict, handoffclient.ReasonAlreadyHandedOff)},
			},
			after: func(t *testing.T, s *scene) { assert.Equal(t, handoff.StateHandedOff, s.reg.State(handoff.RefTo(s.a))) },
		},
		{
			name:  "another pod's valid token is refused",
			setup: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a"))) },
			steps: []step{
				{name: "b is no warm pod", token: func(s *scene) string { return s.tokB }, want: refused(http.StatusForbidden, handoffclient.ReasonUnknownPod)},
				{name: "a still gets its job", token: func(s *scene) string { return s.tokA }, want: handed(jobFor("a"))},
				{name: "b again", token: func(s *scene) string { return s.tokB }, want: refused(http.StatusForbidden, handoffclient.ReasonUnknownPod)},
			},
		},
		{
			name: "a pod's token gets that pod's job only",
			setup: func(s *scene) {
				require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a")))
				require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.b), jobFor("b")))
			},
			steps: []step{
				{name: "a's token", token: func(s *scene) string { return s.tokA }, want: handed(jobFor("a"))},
				{name: "a's token again", token: func(s *scene) string { return s.tokA }, want: refused(http.StatusConflict, handoffclient.ReasonAlreadyHandedOff)},
			},
			after: func(t *testing.T, s *scene) {
				assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.b)), "b's job is still b's")
			},
		},
		{
			name:  "a token for another audience is refused",
			setup: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a"))) },
			steps: []step{
				{name: "another audience", token: func(s *scene) string { return s.f.token(s.a, "vault") }, want: refused(http.StatusUnauthorized, handoffclient.ReasonWrongAudience)},
				{name: "the API server's audience", token: func(s *scene) string { return s.f.token(s.a) }, want: refused(http.StatusUnauthorized, handoffclient.ReasonWrongAudience)},
			},
			after: func(t *testing.T, s *scene) {
				assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.a)), "nothing was handed off")
			},
		},
		{
			name:  "garbage and missing tokens are refused",
			setup: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a"))) },
			steps: []step{
				{name: "garbage", token: func(*scene) string { return "not-a-token" }, want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
				{name: "a tampered token", token: func(s *scene) string { return s.tokA[:len(s.tokA)-4] + "AAAA" }, want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
				{name: "empty", token: func(*scene) string { return "" }, want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
			},
			after: func(t *testing.T, s *scene) { assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.a))) },
		},
		{
			name:  "a token bound to no pod is refused",
			setup: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a"))) },
			steps: []step{
				{name: "the ServiceAccount's unbound token", token: func(s *scene) string { return s.f.token(nil, audience) }, want: refused(http.StatusForbidden, handoffclient.ReasonNotAPod)},
			},
		},
		{
			name: "a pod made again under the same name is another pod",
			setup: func(s *scene) {
				require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a")))
				old := s.a.DeepCopy()
				require.NoError(s.t, env.Client.Delete(context.Background(), s.a, client.GracePeriodSeconds(0)))
				s.a = s.f.pod(s.a.Name)
				require.NotEqual(s.t, old.UID, s.a.UID)
				s.oldA = old
			},
			steps: []step{
				{name: "the old pod's token", token: func(s *scene) string { return s.tokA }, want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
				{name: "the new pod's token", token: func(s *scene) string { return s.f.token(s.a, audience) }, want: refused(http.StatusForbidden, handoffclient.ReasonUnknownPod)},
			},
			after: func(t *testing.T, s *scene) {
				assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.oldA)), "the old pod's job was never handed off")
			},
		},
		{
			name: "a waiting pod with no job is told to come back",
			setup: func(s *scene) {
				require.NoError(s.t, s.reg.Register(handoff.RefTo(s.a)))
			},
			steps: []step{
				{name: "waits", token: func(s *scene) string { return s.tokA }, want: answer{status: http.StatusNoContent}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene(t)
			tc.setup(s)
			logs := &logBuffer{}
			srv := serve(t, handoff.Config{Assignments: s.reg, MaxWait: 200 * time.Millisecond, Log: logs.logger()})
			var secrets []string
			for _, st := range tc.steps {
				tok := st.token(s)
				secrets = append(secrets, tok)
				got := post(t, srv, tok)
				assertAnswer(t, st.want, got, st.name)
				if st.want.status == http.StatusUnauthorized {
					assert.Contains(t, got.header.Get("WWW-Authenticate"), "Bearer", st.name)
				}
			}
			if tc.after != nil {
				tc.after(t, s)
			}
			secrets = append(secrets, "job-token-", "env-secret-", s.tokA, s.tokB)
			logged := logs.String()
			assert.NotEmpty(t, logged)
			if testing.Verbose() {
				t.Log(logged)
			}
			for _, secret := range secrets {
				if len(secret) > 8 {
					assert.NotContains(t, logged, secret, "the log holds no token or job secret")
				}
			}
		})
	}
}

// scene is a namespace with two warm pods, a and b, their tokens for the endpoint, and a
// ready registry.
type scene struct {
	t          *testing.T
	f          *fixture
	a, b, oldA *corev1.Pod
	tokA, tokB string
	reg        *handoff.Registry
}

func newScene(t *testing.T) *scene {
	f := newFixture(t)
	s := &scene{t: t, f: f, a: f.pod("warm-a"), b: f.pod("warm-b"), reg: handoff.NewRegistry()}
	s.tokA, s.tokB = f.token(s.a, audience), f.token(s.b, audience)
	s.reg.MarkReady()
	return s
}

func TestHandOffRefusesBadRequests(t *testing.T) {
	s := newScene(t)
	require.NoError(t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a")))
	srv := serve(t, handoff.Config{Assignments: s.reg})
	for _, tc := range []struct {
		name          string
		method, authz string
		body          io.Reader
		want          answer
	}{
		{name: "GET", method: http.MethodGet, authz: "Bearer " + s.tokA, want: refused(http.StatusMethodNotAllowed, handoffclient.ReasonMethodNotAllowed)},
		{name: "PUT", method: http.MethodPut, authz: "Bearer " + s.tokA, want: refused(http.StatusMethodNotAllowed, handoffclient.ReasonMethodNotAllowed)},
		{name: "no Authorization", method: http.MethodPost, want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
		{name: "Basic", method: http.MethodPost, authz: "Basic " + s.tokA, want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
		{name: "a huge token", method: http.MethodPost, authz: "Bearer " + strings.Repeat("x", 20<<10), want: refused(http.StatusUnauthorized, handoffclient.ReasonUnauthenticated)},
		{name: "a large body", method: http.MethodPost, authz: "Bearer " + s.tokA, body: bytes.NewReader(make([]byte, 64<<10)), want: refused(http.StatusRequestEntityTooLarge, handoffclient.ReasonBadRequest)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := request(t, srv, tc.method, tc.authz, tc.body)
			assertAnswer(t, tc.want, got)
			if tc.want.status == http.StatusMethodNotAllowed {
				assert.Equal(t, http.MethodPost, got.header.Get("Allow"))
			}
		})
	}
	assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.a)), "no bad request took the job")
	assertAnswer(t, handed(jobFor("a")), post(t, srv, s.tokA), "a well-formed request after them")
}

type failingClient struct{ client.Client }

func (failingClient) Create(context.Context, client.Object, ...client.CreateOption) error {
	return errors.New("dial tcp 10.0.0.1:443: connect: connection refused")
}

func TestHandOffAsksToComeBackWhenItCannotTell(t *testing.T) {
	s := newScene(t)
	notReady := handoff.NewRegistry()
	for _, tc := range []struct {
		name string
		cfg  handoff.Config
		want answer
	}{
		{name: "the API server is unreachable", cfg: handoff.Config{Assignments: s.reg, Client: failingClient{env.Client}}, want: refused(http.StatusServiceUnavailable, handoffclient.ReasonReviewUnavailable)},
		{name: "the operator has just started", cfg: handoff.Config{Assignments: notReady}, want: refused(http.StatusServiceUnavailable, handoffclient.ReasonUnavailable)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, serve(t, tc.cfg), s.tokA)
			assertAnswer(t, tc.want, got)
		})
	}
}

// reviewer answers every TokenReview with the same status, to show what the handler makes
// of answers the API server does not give for our audience but another authenticator might.
type reviewer struct {
	client.Client
	status authv1.TokenReviewStatus
}

func (r reviewer) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	obj.(*authv1.TokenReview).Status = r.status
	return nil
}

func TestHandOffTrustsOnlyWhatTheReviewSays(t *testing.T) {
	s := newScene(t)
	require.NoError(t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a")))
	podExtra := map[string]authv1.ExtraValue{handoff.ExtraPodName: {s.a.Name}, handoff.ExtraPodUID: {string(s.a.UID)}}
	saUser := "system:serviceaccount:" + s.a.Namespace + ":warm"
	for _, tc := range []struct {
		name   string
		status authv1.TokenReviewStatus
		want   answer
	}{
		{name: "authenticated without our audience", status: authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"https://kubernetes.default.svc"},
			User: authv1.UserInfo{Username: saUser, Extra: podExtra}}, want: refused(http.StatusUnauthorized, handoffclient.ReasonWrongAudience)},
		{name: "authenticated with no audiences", status: authv1.TokenReviewStatus{Authenticated: true,
			User: authv1.UserInfo{Username: saUser, Extra: podExtra}}, want: refused(http.StatusUnauthorized, handoffclient.ReasonWrongAudience)},
		{name: "a user, not a service account", status: authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience},
			User: authv1.UserInfo{Username: "alice", Extra: podExtra}}, want: refused(http.StatusForbidden, handoffclient.ReasonNotAPod)},
		{name: "a malformed service account name", status: authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience},
			User: authv1.UserInfo{Username: "system:serviceaccount:" + s.a.Namespace, Extra: podExtra}}, want: refused(http.StatusForbidden, handoffclient.ReasonNotAPod)},
		{name: "two pod names", status: authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience},
			User: authv1.UserInfo{Username: saUser, Extra: map[string]authv1.ExtraValue{handoff.ExtraPodName: {s.a.Name, s.b.Name}, handoff.ExtraPodUID: {string(s.a.UID)}}}},
			want: refused(http.StatusForbidden, handoffclient.ReasonNotAPod)},
		{name: "no pod UID", status: authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience},
			User: authv1.UserInfo{Username: saUser, Extra: map[string]authv1.ExtraValue{handoff.ExtraPodName: {s.a.Name}}}},
			want: refused(http.StatusForbidden, handoffclient.ReasonNotAPod)},
		{name: "another namespace's pod of the same name and UID", status: authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience},
			User: authv1.UserInfo{Username: "system:serviceaccount:elsewhere:warm", Extra: podExtra}}, want: refused(http.StatusForbidden, handoffclient.ReasonUnknownPod)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, serve(t, handoff.Config{Assignments: s.reg, Client: reviewer{env.Client, tc.status}}), s.tokA)
			assertAnswer(t, tc.want, got)
		})
	}
	assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.a)), "none of them took a's job")
	ok := authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{audience}, User: authv1.UserInfo{Username: saUser, Extra: podExtra}}
	assertAnswer(t, handed(jobFor("a")), post(t, serve(t, handoff.Config{Assignments: s.reg, Client: reviewer{env.Client, ok}}), "any"), "the stub does let a pod through")
}

func TestNewHandlerNeedsItsParts(t *testing.T) {
	reg := handoff.NewRegistry()
	for _, tc := range []struct {
		name    string
		cfg     handoff.Config
		wantErr string
	}{
		{name: "audience", cfg: handoff.Config{Client: env.Client, Assignments: reg}, wantErr: "an audience is needed"},
		{name: "client", cfg: handoff.Config{Audience: audience, Assignments: reg}, wantErr: "Kubernetes client"},
		{name: "assignments", cfg: handoff.Config{Audience: audience, Client: env.Client}, wantErr: "no Assignments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := handoff.NewHandler(tc.cfg)
			assert.ErrorContains(t, err, tc.wantErr)
		})
	}
}

// observed tells when a claim found the pod waiting: the handler then holds the request.
type observed struct {
	handoff.Assignments
	waiting chan handoff.PodRef
}

func (o observed) Claim(ctx context.Context, pod handoff.PodRef) (handoffclient.Job, error) {
	job, err := o.Assignments.Claim(ctx, pod)
	if errors.Is(err, handoff.ErrNotAssigned) {
		select {
		case o.waiting <- pod:
		default:
		}
	}
	return job, err
}

func TestLongPoll(t *testing.T) {
	for _, tc := range []struct {
		name string
		// during acts while the request waits.
		during func(s *scene)
		want   answer
	}{
		{name: "an assignment during the wait", during: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a"))) }, want: handed(jobFor("a"))},
		{name: "another pod's assignment does not wake it", during: func(s *scene) { require.NoError(s.t, s.reg.Assign(handoff.RefTo(s.b), jobFor("b"))) }, want: answer{status: http.StatusNoContent}},
		{name: "the pod forgotten during the wait", during: func(s *scene) { s.reg.Forget(handoff.RefTo(s.a)) }, want: refused(http.StatusForbidden, handoffclient.ReasonUnknownPod)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene(t)
			require.NoError(t, s.reg.Register(handoff.RefTo(s.a)))
			require.NoError(t, s.reg.Register(handoff.RefTo(s.b)))
			obs := observed{Assignments: s.reg, waiting: make(chan handoff.PodRef, 1)}
			const maxWait = 2 * time.Second
			srv := serve(t, handoff.Config{Assignments: obs, MaxWait: maxWait})
			start := time.Now()
			got := make(chan answer, 1)
			go func() { got <- post(t, srv, s.tokA) }()
			select {
			case pod := <-obs.waiting:
				require.Equal(t, handoff.RefTo(s.a), pod)
			case <-time.After(10 * time.Second):
				t.Fatal("the request never waited")
			}
			tc.during(s)
			a := <-got
			assertAnswer(t, tc.want, a)
			if a.status == http.StatusNoContent {
				assert.GreaterOrEqual(t, time.Since(start), maxWait, "held for the whole wait")
				assert.Equal(t, "0", a.header.Get("Retry-After"))
			} else {
				assert.Less(t, time.Since(start), maxWait, "answered as soon as the pod changed")
			}
		})
	}
}

// recorder notes each answer's status and the token it was asked with.
type recorder struct {
	next     http.Handler
	mu       sync.Mutex
	statuses []int
	tokens   []string
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	r.next.ServeHTTP(sw, req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses = append(r.statuses, sw.status)
	r.tokens = append(r.tokens, strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "))
}

func (r *recorder) seen() ([]int, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.statuses...), append([]string(nil), r.tokens...)
}

// TestClientAgainstTheEndpoint runs the supervisor's client against the endpoint and the
// real API server: it waits through 204s, reads the token file afresh each time, and
// gets its job.
func TestClientAgainstTheEndpoint(t *testing.T) {
	s := newScene(t)
	require.NoError(t, s.reg.Register(handoff.RefTo(s.a)))
	h, err := handoff.NewHandler(handoff.Config{Audience: audience, Client: env.Client, Assignments: s.reg, MaxWait: 100 * time.Millisecond})
	require.NoError(t, err)
	rec := &recorder{next: h}
	srv := httptest.NewTLSServer(rec)
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	caPath, tokenPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	require.NoError(t, os.WriteFile(tokenPath, []byte(s.tokA), 0o600))
	c := &handoffclient.Client{URL: srv.URL, TokenPath: tokenPath, CAPath: caPath, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		job handoffclient.Job
		err error
	}
	done := make(chan result, 1)
	go func() {
		job, err := c.Fetch(ctx)
		done <- result{job, err}
	}()

	// Let one long poll end in a 204, rotate the token as the kubelet would, and wait for
	// a request with the new token to be answered (204) before assigning: the requests
	// after it carry the new token too.
	rotated := s.f.token(s.a, audience)
	require.NotEqual(t, s.tokA, rotated)
	require.Eventually(t, func() bool {
		statuses, _ := rec.seen()
		return len(statuses) >= 1
	}, 10*time.Second, 10*time.Millisecond, "a 204")
	require.NoError(t, os.WriteFile(tokenPath+".new", []byte(rotated+"\n"), 0o600))
	require.NoError(t, os.Rename(tokenPath+".new", tokenPath))
	require.Eventually(t, func() bool {
		_, tokens := rec.seen()
		return len(tokens) > 0 && tokens[len(tokens)-1] == rotated
	}, 10*time.Second, 10*time.Millisecond, "a request with the rotated token")
	require.NoError(t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a")))

	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, jobFor("a"), r.job)
	statuses, tokens := rec.seen()
	assert.Contains(t, statuses, http.StatusNoContent, "the client waited through a 204")
	assert.Equal(t, http.StatusOK, statuses[len(statuses)-1])
	assert.Equal(t, s.tokA, tokens[0])
	assert.Equal(t, rotated, tokens[len(tokens)-1], "the job went to the rotated token")

	// The job is gone: the same client, asking again, is refused at once.
	_, err = c.Fetch(ctx)
	var refusedErr *handoffclient.RefusedError
	require.ErrorAs(t, err, &refusedErr)
	assert.Equal(t, http.StatusConflict, refusedErr.Status)
	assert.Equal(t, handoffclient.ReasonAlreadyHandedOff, refusedErr.Reason)
}

// TestHandOffFromThePodOnly: with Addresses set, a pod's own valid token is good only from
// that pod's address, so a token copied out of the pod is of no use elsewhere. The test's
// client connects from 127.0.0.1.
func TestHandOffFromThePodOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		ips  []string
		want answer
	}{
		{name: "from the pod's address", ips: []string{"127.0.0.1"}, want: handed(jobFor("a"))},
		{name: "from the pod's second address", ips: []string{"fd00::9", "127.0.0.1"}, want: handed(jobFor("a"))},
		{name: "from elsewhere: a stolen token", ips: []string{"10.88.0.9"}, want: refused(http.StatusForbidden, handoffclient.ReasonWrongAddress)},
		{name: "before the pod has an address", want: refused(http.StatusServiceUnavailable, handoffclient.ReasonUnavailable)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScene(t)
			ctx := context.Background()
			for _, ip := range tc.ips {
				s.a.Status.PodIPs = append(s.a.Status.PodIPs, corev1.PodIP{IP: ip})
			}
			if len(tc.ips) > 0 {
				s.a.Status.PodIP = tc.ips[0]
				require.NoError(t, env.Client.Status().Update(ctx, s.a))
			}
			require.NoError(t, s.reg.Assign(handoff.RefTo(s.a), jobFor("a")))
			srv := serve(t, handoff.Config{Assignments: s.reg, Addresses: handoff.PodAddressesFrom(env.Client)})
			assertAnswer(t, tc.want, post(t, srv, s.tokA))
			if tc.want.status != http.StatusOK {
				assert.Equal(t, handoff.StateAssigned, s.reg.State(handoff.RefTo(s.a)), "a refused request takes nothing")
			}
		})
	}
	t.Run("a pod recreated under the same name", func(t *testing.T) {
		s := newScene(t)
		_, err := handoff.PodAddressesFrom(env.Client).PodIPs(context.Background(), handoff.PodRef{Namespace: s.a.Namespace, Name: s.a.Name, UID: "not-its-uid"})
		assert.ErrorIs(t, err, handoff.ErrUnknownPod)
	})
}
