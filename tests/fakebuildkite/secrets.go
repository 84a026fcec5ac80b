package fakebuildkite

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
)

// Buildkite secrets (the agent's api/secrets.go): a job reads a secret of its pipeline by
// key with its job token, for `buildkite-agent secret get` and for the step's `secrets:`,
// which bootstrap fetches from BUILDKITE_SECRETS_CONFIG before the job's hooks run. On
// Buildkite a secret belongs to a cluster and policies say which pipelines may read it;
// the fake keeps the outcome, a pipeline's secrets, which tests set with SetSecret or
// PUT /control/pipelines/{org}/{pipeline}/secrets/{key}. Values are never logged.

// secretKeyRE is the shape Buildkite gives secret keys: letters, digits and underscores,
// not starting with a digit.
var secretKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

type secret struct {
	key, value, uuid string
}

// secretsKey names a pipeline's secrets in Server.secrets, where each is stored by its key
// upper-cased: keys are case-insensitive (`secret get deploy_key` and `secret get
// DEPLOY_KEY` read the same one).
func secretsKey(org, pipeline string) string { return org + "/" + pipeline }

// SetSecret creates or replaces the secret key of the pipeline org/pipeline.
func (s *Server) SetSecret(org, pipeline, key, value string) error {
	if !secretKeyRE.MatchString(key) {
		return fmt.Errorf("fake buildkite: secret key %q: use letters, digits and underscores, not starting with a digit", key)
	}
	if upper := strings.ToUpper(key); strings.HasPrefix(upper, "BUILDKITE") || strings.HasPrefix(upper, "BK") {
		return fmt.Errorf("fake buildkite: secret key %q: keys starting with buildkite or bk are reserved", key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secrets == nil {
		s.secrets = map[string]map[string]secret{}
	}
	p := secretsKey(org, pipeline)
	if s.secrets[p] == nil {
		s.secrets[p] = map[string]secret{}
	}
	sec := s.secrets[p][strings.ToUpper(key)]
	if sec.uuid == "" {
		sec.uuid = newUUID()
	}
	sec.key, sec.value = key, value
	s.secrets[p][strings.ToUpper(key)] = sec
	s.logf("fake buildkite: secret %s of %s set", key, p)
	return nil
}

// DeleteSecret removes the secret key of the pipeline org/pipeline, reporting whether it
// was there.
func (s *Server) DeleteSecret(org, pipeline, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := secretsKey(org, pipeline)
	_, ok := s.secrets[p][strings.ToUpper(key)]
	delete(s.secrets[p], strings.ToUpper(key))
	return ok
}

// handleSecret serves GET /v3/jobs/{id}/secrets?key=KEY: the secret of the job's pipeline.
func (s *Server) handleSecret(w http.ResponseWriter, r *http.Request, j *job, _ *noBody) {
	key := r.URL.Query().Get("key")
	if key == "" {
		writeError(w, http.StatusUnprocessableEntity, "Secret needs a key query parameter")
		return
	}
	b := s.builds[j.buildID]
	sec, ok := s.secrets[secretsKey(b.org, b.pipeline)][strings.ToUpper(key)]
	if !ok {
		writeError(w, http.StatusNotFound, "No secret %q is available to pipeline %s/%s", key, b.org, b.pipeline)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"key": sec.key, "value": sec.value, "uuid": sec.uuid})
}

// secretRoutes serves the agent API's secret endpoint and the control API's secrets.
func (s *Server) secretRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v3/jobs/{id}/secrets", s.endpoint(EPSecrets, jobHandler(s, s.handleSecret)))
	mux.HandleFunc("PUT /control/pipelines/{org}/{pipeline}/secrets/{key}", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Value *string `json:"value"`
		}
		if err := decodeJSON(r, &req); err != nil || req.Value == nil {
			writeError(w, http.StatusBadRequest, `a secret needs a body {"value": "..."}`)
			return
		}
		if err := s.SetSecret(r.PathValue("org"), r.PathValue("pipeline"), r.PathValue("key"), *req.Value); err != nil {
			writeError(w, http.StatusUnprocessableEntity, "%v", err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("DELETE /control/pipelines/{org}/{pipeline}/secrets/{key}", func(w http.ResponseWriter, r *http.Request) {
		if !s.DeleteSecret(r.PathValue("org"), r.PathValue("pipeline"), r.PathValue("key")) {
			writeError(w, http.StatusNotFound, "pipeline %s/%s has no secret %q", r.PathValue("org"), r.PathValue("pipeline"), r.PathValue("key"))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
