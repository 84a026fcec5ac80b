package fakebuildkite

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSecrets(t *testing.T) {
	s := startFake(t, Options{})
	a, j := startedJob(t, s, oneStep)
	require.NoError(t, s.SetSecret("org", "pipeline", "Deploy_Key", "s3cret value"))
	require.NoError(t, s.SetSecret("org", "other-pipeline", "OTHER_ONLY", "not for this job"))
	// Set through the control API, as a test outside the process would.
	status, _, body := s.requestForTest(t, "PUT", s.URL()+"/control/pipelines/org/pipeline/secrets/API_TOKEN", "", map[string]string{"value": "from control"})
	require.Equal(t, http.StatusNoContent, status, "%s", body)

	get := func(key string) string { return "/jobs/" + j.ID + "/secrets?key=" + url.QueryEscape(key) }
	tests := []struct {
		name, path, token string
		wantStatus        int
		wantValue         string
	}{
		{"by its key", get("Deploy_Key"), j.Token, 200, "s3cret value"},
		{"keys are case-insensitive", get("deploy_key"), j.Token, 200, "s3cret value"},
		{"set through the control API", get("API_TOKEN"), j.Token, 200, "from control"},
		{"another pipeline's secret", get("OTHER_ONLY"), j.Token, 404, ""},
		{"no such secret", get("MISSING"), j.Token, 404, ""},
		{"no key", "/jobs/" + j.ID + "/secrets", j.Token, 422, ""},
		{"with the agent's access token", get("Deploy_Key"), a.token, 401, ""},
		{"without a token", get("Deploy_Key"), "", 401, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, s, "GET", tt.path, tt.token, nil)
			require.Equal(t, tt.wantStatus, r.status, "%s", r.body)
			if tt.wantStatus != http.StatusOK {
				assert.NotEmpty(t, r.message(t))
				return
			}
			var sec struct{ Key, Value, UUID string }
			r.json(t, &sec)
			assert.Equal(t, tt.wantValue, sec.Value)
			assert.NotEmpty(t, sec.UUID)
		})
	}

	for _, key := range []string{"1ST", "has-dash", "BUILDKITE_X", "bk_token", ""} {
		assert.Error(t, s.SetSecret("org", "pipeline", key, "v"), "key %q", key)
	}
	status, _, _ = s.requestForTest(t, "DELETE", s.URL()+"/control/pipelines/org/pipeline/secrets/api_token", "", nil)
	assert.Equal(t, http.StatusNoContent, status)
	assert.Equal(t, 404, call(t, s, "GET", get("API_TOKEN"), j.Token, nil).status, "deleted")
	status, _, _ = s.requestForTest(t, "PUT", s.URL()+"/control/pipelines/org/pipeline/secrets/X", "", map[string]string{})
	assert.Equal(t, http.StatusBadRequest, status, "a secret without a value")
}

func TestOIDCToken(t *testing.T) {
	s := startFake(t, Options{})
	_, err := s.CreateBuild(BuildRequest{PipelineYAML: oneStep, Repo: "https://example.invalid/repo.git", Commit: "abc123", Branch: "feature"})
	require.NoError(t, err)
	a := registerAgent(t, s, "unit", "queue=default", "size=large")
	j := takeJob(t, s, a)
	tokens := "/jobs/" + j.ID + "/oidc/tokens"

	tests := []struct {
		name       string
		token      string
		body       any
		wantStatus int
		want       map[string]any // claims the token must have
		lifetime   time.Duration
	}{
		{name: "the default audience and lifetime", token: j.Token, body: map[string]any{}, wantStatus: 200,
			want:     map[string]any{"aud": "https://buildkite.com/org", "job_id": j.ID, "pipeline_slug": "pipeline", "build_branch": "feature", "step_key": "one", "agent_id": a.id},
			lifetime: DefaultOIDCLifetime},
		{name: "an audience and a lifetime", token: j.Token, body: map[string]any{"audience": "sts.amazonaws.com", "lifetime": 60}, wantStatus: 200,
			want:     map[string]any{"aud": "sts.amazonaws.com", "sub": "organization:org:pipeline:pipeline:ref:refs/heads/feature:commit:abc123:step:one"},
			lifetime: time.Minute},
		{name: "optional claims, a subject claim and session tags", token: j.Token,
			body:       map[string]any{"claims": []string{"pipeline_id", "agent_tag:size"}, "subject_claim": "pipeline_id", "aws_session_tags": []string{"organization_slug", "agent_tag:size"}},
			wantStatus: 200,
			want: map[string]any{"pipeline_id": pipelineID("org", "pipeline"), "sub": pipelineID("org", "pipeline"), "agent_tag:size": "large",
				"https://aws.amazon.com/tags": map[string]any{"principal_tags": map[string]any{"organization_slug": []any{"org"}, "agent_tag:size": []any{"large"}}}},
			lifetime: DefaultOIDCLifetime},
		{name: "a negative lifetime", token: j.Token, body: map[string]any{"lifetime": -1}, wantStatus: 422},
		{name: "a lifetime that is not a number", token: j.Token, body: map[string]any{"lifetime": "60"}, wantStatus: 422},
		{name: "an unknown claim", token: j.Token, body: map[string]any{"claims": []string{"favourite_colour"}}, wantStatus: 422},
		{name: "a tag the agent does not have", token: j.Token, body: map[string]any{"claims": []string{"agent_tag:gpu"}}, wantStatus: 422},
		{name: "a subject claim the token lacks", token: j.Token, body: map[string]any{"subject_claim": "organization_id"}, wantStatus: 422},
		{name: "the agent's access token", token: a.token, body: map[string]any{}, wantStatus: 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := call(t, s, "POST", tokens, tt.token, tt.body)
			require.Equal(t, tt.wantStatus, r.status, "%s", r.body)
			if tt.wantStatus != http.StatusOK {
				return
			}
			var tok struct{ Token string }
			r.json(t, &tok)
			assert.Len(t, strings.Split(tok.Token, "."), 3, "a JWT")
			claims, err := s.VerifyOIDCToken(tok.Token)
			require.NoError(t, err)
			for k, v := range tt.want {
				assert.Equal(t, v, claims[k], k)
			}
			assert.Equal(t, "https://agent.buildkite.com", claims["iss"])
			exp, iat := claims["exp"].(float64), claims["iat"].(float64)
			assert.Equal(t, tt.lifetime.Seconds(), exp-iat, "lifetime")

			_, err = s.VerifyOIDCToken(tok.Token[:len(tok.Token)-2] + "xx")
			assert.Error(t, err, "a token whose signature was changed")
		})
	}
	reqs := s.OIDCTokenRequests(j.ID)
	require.Len(t, reqs, len(tests)-2, "every request with the job's token that decoded is recorded")
	assert.Equal(t, OIDCTokenRequest{JobID: j.ID, Audience: "sts.amazonaws.com", Lifetime: 60}, reqs[1])
}

// TestStreamPingsNotOffered checks the answer to the streaming ping of a fake that does not
// offer it (NoStreaming): unimplemented, in the protocol the client spoke, which agents take
// as "poll instead, for good".
func TestStreamPingsNotOffered(t *testing.T) {
	s := startFake(t, Options{NoStreaming: true})
	a := registerAgent(t, s, "unit", "queue=default")
	tests := []struct {
		contentType string
		wantStatus  int
		wantHeader  map[string]string
		wantBody    string
	}{
		{"application/grpc", 200, map[string]string{"Grpc-Status": "12", "Content-Type": "application/grpc"}, ""},
		{"application/grpc+proto", 200, map[string]string{"Grpc-Status": "12"}, ""},
		{"application/connect+proto", 404, nil, `"code":"unimplemented"`},
	}
	for _, tt := range tests {
		t.Run(tt.contentType, func(t *testing.T) {
			req, err := http.NewRequest("POST", s.URL()+streamPingsPath, strings.NewReader(""))
			require.NoError(t, err)
			req.Header.Set("Content-Type", tt.contentType)
			req.Header.Set("Authorization", "Token "+a.token)
			resp, err := testClient.Do(req)
			require.NoError(t, err)
			defer func() { _ = resp.Body.Close() }()
			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			for k, v := range tt.wantHeader {
				assert.Equal(t, v, resp.Header.Get(k), k)
			}
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Contains(t, string(body), tt.wantBody)
		})
	}
	assert.Equal(t, len(tests), s.RequestCount(EPStreamPings, ""), "recorded as stream_pings")
}
