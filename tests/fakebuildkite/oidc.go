package fakebuildkite

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// OIDC tokens (the agent's api/oidc.go): `buildkite-agent oidc request-token` asks
// POST /v3/jobs/{id}/oidc/tokens, with the job token, for a JWT about the job. The fake
// makes one with Buildkite's claims and signs it with HS256 under a key of its own, which
// VerifyOIDCToken checks; nothing outside the fake can verify it, which is all a test
// needs. Requests are recorded (OIDCTokenRequests), tokens are not.

// DefaultOIDCLifetime is the lifetime of a token whose request names none (the agent sends
// none for `--lifetime 0` or no flag, leaving the choice to Buildkite).
const DefaultOIDCLifetime = 5 * time.Minute

const oidcIssuer = "https://agent.buildkite.com"

// OIDCTokenRequest is one request for a token, as the fake received it.
type OIDCTokenRequest struct {
	JobID          string   `json:"job_id"`
	Audience       string   `json:"audience,omitempty"`
	Lifetime       int      `json:"lifetime,omitempty"`
	Claims         []string `json:"claims,omitempty"`
	AWSSessionTags []string `json:"aws_session_tags,omitempty"`
	SubjectClaim   string   `json:"subject_claim,omitempty"`
}

// oidcOptionalClaims are the claims a request may add beyond the standard ones (besides
// agent_tag:NAME, one of the accepting agent's tags).
var oidcOptionalClaims = []string{"organization_id", "pipeline_id"}

// OIDCTokenRequests returns the token requests made for a job ("" for all), in order.
func (s *Server) OIDCTokenRequests(jobID string) []OIDCTokenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []OIDCTokenRequest
	for _, r := range s.oidcRequests {
		if jobID == "" || r.JobID == jobID {
			out = append(out, r)
		}
	}
	return out
}

// VerifyOIDCToken checks a token's signature and lifetime and returns its claims.
func (s *Server) VerifyOIDCToken(token string) (map[string]any, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("fake buildkite: an OIDC token is three base64url parts joined by dots")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, s.oidcSign(parts[0]+"."+parts[1])) {
		return nil, errors.New("fake buildkite: the OIDC token's signature is not the fake's")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("fake buildkite: the OIDC token's claims: %w", err)
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, fmt.Errorf("fake buildkite: the OIDC token's claims: %w", err)
	}
	if exp, _ := claims["exp"].(float64); time.Now().Unix() >= int64(exp) {
		return claims, errors.New("fake buildkite: the OIDC token has expired")
	}
	return claims, nil
}

// oidcSign signs with the fake's key, made on first use.
func (s *Server) oidcSign(data string) []byte {
	s.oidcKeyOnce.Do(func() {
		s.oidcKey = make([]byte, 32)
		if _, err := rand.Read(s.oidcKey); err != nil {
			panic(fmt.Sprintf("crypto/rand: %v", err))
		}
	})
	mac := hmac.New(sha256.New, s.oidcKey)
	mac.Write([]byte(data))
	return mac.Sum(nil)
}

// oidcTokenBody is the request body, its fields as the agent names them.
type oidcTokenBody struct {
	Audience       string   `json:"audience"`
	Lifetime       int      `json:"lifetime"`
	Claims         []string `json:"claims"`
	AWSSessionTags []string `json:"aws_session_tags"`
	SubjectClaim   string   `json:"subject_claim"`
}

func (s *Server) handleOIDCToken(w http.ResponseWriter, _ *http.Request, j *job, req *oidcTokenBody) {
	s.oidcRequests = append(s.oidcRequests, OIDCTokenRequest{
		JobID: j.id, Audience: req.Audience, Lifetime: req.Lifetime, Claims: req.Claims,
		AWSSessionTags: req.AWSSessionTags, SubjectClaim: req.SubjectClaim,
	})
	s.notifyLocked()
	if req.Lifetime < 0 {
		writeError(w, http.StatusUnprocessableEntity, "Lifetime must be a non-negative number of seconds, got %d", req.Lifetime)
		return
	}
	b := s.builds[j.buildID]
	claims := map[string]any{
		"organization_slug": b.org,
		"pipeline_slug":     b.pipeline,
		"build_number":      b.number,
		"build_branch":      b.branch,
		"build_tag":         j.env["BUILDKITE_TAG"],
		"build_commit":      b.commit,
		"build_source":      j.env["BUILDKITE_SOURCE"],
		"step_key":          j.stepKey,
		"job_id":            j.id,
		"agent_id":          j.acceptedBy,
	}
	for _, c := range req.Claims {
		switch tag, isTag := strings.CutPrefix(c, "agent_tag:"); {
		case c == "organization_id":
			claims[c] = pipelineID(b.org, "")
		case c == "pipeline_id":
			claims[c] = pipelineID(b.org, b.pipeline)
		case isTag && s.agentTagLocked(j.acceptedBy, tag) != "":
			claims[c] = s.agentTagLocked(j.acceptedBy, tag)
		default:
			writeError(w, http.StatusUnprocessableEntity, "Unknown claim %q: the fake adds %s and agent_tag:<a tag of the agent>", c, strings.Join(oidcOptionalClaims, ", "))
			return
		}
	}
	sub := fmt.Sprintf("organization:%s:pipeline:%s:ref:refs/heads/%s:commit:%s:step:%s", b.org, b.pipeline, b.branch, b.commit, j.stepKey)
	if req.SubjectClaim != "" {
		v, ok := claims[req.SubjectClaim]
		if !ok {
			writeError(w, http.StatusUnprocessableEntity, "Subject claim %q is not a claim of the token: request it with --claim", req.SubjectClaim)
			return
		}
		sub = fmt.Sprint(v)
	}
	if len(req.AWSSessionTags) > 0 {
		tags := map[string][]string{}
		for _, t := range req.AWSSessionTags {
			v, ok := claims[t]
			if !ok {
				writeError(w, http.StatusUnprocessableEntity, "AWS session tag %q is not a claim of the token", t)
				return
			}
			tags[t] = []string{fmt.Sprint(v)}
		}
		claims["https://aws.amazon.com/tags"] = map[string]any{"principal_tags": tags}
	}
	aud := req.Audience
	if aud == "" {
		aud = "https://buildkite.com/" + b.org
	}
	lifetime := DefaultOIDCLifetime
	if req.Lifetime > 0 {
		lifetime = time.Duration(req.Lifetime) * time.Second
	}
	now := time.Now()
	claims["iss"], claims["sub"], claims["aud"] = oidcIssuer, sub, aud
	claims["iat"], claims["nbf"], claims["exp"] = now.Unix(), now.Unix(), now.Add(lifetime).Unix()
	claims["jti"] = newUUID()
	token, err := s.signJWT(claims)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	s.logf("fake buildkite: job %s: OIDC token for audience %q, lifetime %s", j.id, aud, lifetime)
	writeJSON(w, http.StatusOK, map[string]string{"token": token})
}

// agentTagLocked is the value of an agent's tag, or "".
func (s *Server) agentTagLocked(agentID, name string) string {
	a, ok := s.agents[agentID]
	if !ok {
		return ""
	}
	for _, t := range a.tags {
		if k, v, _ := strings.Cut(t, "="); k == name {
			return v
		}
	}
	return ""
}

func (s *Server) signJWT(claims map[string]any) (string, error) {
	header, err := json.Marshal(map[string]string{"alg": "HS256", "typ": "JWT", "kid": "fake-buildkite"})
	if err != nil {
		return "", fmt.Errorf("fake buildkite: OIDC token header: %w", err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("fake buildkite: OIDC token claims: %w", err)
	}
	signed := base64.RawURLEncoding.EncodeToString(header) + "." + base64.RawURLEncoding.EncodeToString(payload)
	return signed + "." + base64.RawURLEncoding.EncodeToString(s.oidcSign(signed)), nil
}

// oidcRoutes serves the agent API's token endpoint.
func (s *Server) oidcRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v3/jobs/{id}/oidc/tokens", s.endpoint(EPOIDCToken, jobHandler(s, s.handleOIDCToken)))
}
