package fakebuildkite

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"time"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	api := func(pattern, name string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" /v3"+path, s.endpoint(name, h))
	}
	// Agent-token endpoints.
	api("POST /register", EPRegister, s.handleRegister)
	api("POST /connect", EPConnect, agentHandler(s, s.handleConnect))
	api("GET /ping", EPPing, agentHandler(s, s.handlePing))
	api("POST /heartbeat", EPHeartbeat, agentHandler(s, s.handleHeartbeat))
	api("POST /stop", EPStop, agentHandler(s, s.handleStop))
	api("POST /disconnect", EPDisconnect, agentHandler(s, s.handleDisconnect))
	api("PUT /jobs/{id}/accept", EPAccept, agentHandler(s, s.handleAccept))
	api("PUT /jobs/{id}/acquire", EPAccept, agentHandler(s, s.handleAcquire))
	// The streaming ping, outside /v3: see pingstream.go.
	mux.HandleFunc("POST "+streamPingsPath, s.endpoint(EPStreamPings, s.streamPingsHandler()))
	// Job-token endpoints.
	api("PUT /jobs/{id}/start", EPStart, jobHandler(s, s.handleStart))
	api("GET /jobs/{id}", EPJobState, jobHandler(s, s.handleJobState))
	api("POST /jobs/{id}/chunks", EPChunks, s.handleChunks)
	api("POST /jobs/{id}/header_times", EPHeaderTimes, jobHandler(s, s.handleHeaderTimes))
	api("PUT /jobs/{id}/finish", EPFinish, s.handleFinish)
	for _, scope := range []string{"jobs", "builds"} {
		api("POST /"+scope+"/{id}/data/get", EPMetaData, metaDataHandler(s, s.handleMetaDataGet))
		api("POST /"+scope+"/{id}/data/exists", EPMetaData, metaDataHandler(s, s.handleMetaDataExists))
		api("POST /"+scope+"/{id}/data/keys", EPMetaData, metaDataHandler(s, s.handleMetaDataKeys))
	}
	api("POST /jobs/{id}/data/set", EPMetaData, metaDataHandler(s, s.handleMetaDataSet))
	api("POST /jobs/{id}/data/set-batch", EPMetaData, metaDataHandler(s, s.handleMetaDataSetBatch))
	api("POST /jobs/{id}/annotations", EPAnnotations, s.handleAnnotate)
	api("DELETE /jobs/{id}/annotations/{context}", EPAnnotations, jobHandler(s, s.handleAnnotationRemove))
	api("POST /jobs/{id}/pipelines", EPPipelineUpload, jobHandler(s, s.handlePipelineUpload))
	api("GET /jobs/{id}/pipelines/{uuid}", EPPipelineStatus, jobHandler(s, s.handlePipelineStatus))
	api("POST /jobs/{id}/artifacts", EPArtifacts, jobHandler(s, s.handleArtifactsCreate))
	api("PUT /jobs/{id}/artifacts", EPArtifacts, jobHandler(s, s.handleArtifactsUpdate))
	api("GET /builds/{id}/artifacts/search", EPArtifacts, s.handleArtifactsSearch)
	// Where artifact upload instructions point: an S3-style form POST, no token.
	mux.HandleFunc("POST /_artifacts/upload/{job}/{batch}", s.endpoint(EPArtifactUpload, s.handleArtifactUpload))
	mux.HandleFunc("GET /_artifacts/{artifact}", s.endpoint(EPArtifactContent, s.handleArtifactDownload))
	s.secretRoutes(mux) // with the control API's secrets
	s.oidcRoutes(mux)
	s.restRoutes(mux) // the REST API (v2) agentd's start-up check asks: restapi.go

	s.controlRoutes(mux)
	return mux
}

// tokenOf returns the token of an "Authorization: Token <t>" header, the only scheme the agent
// API takes.
func tokenOf(r *http.Request) string {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Token ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(tok)
}

// authAgentLocked returns the agent behind an access token, or writes 401.
func (s *Server) authAgentLocked(w http.ResponseWriter, r *http.Request) *agent {
	id, ok := s.accessToken[tokenOf(r)]
	if !ok {
		writeError(w, http.StatusUnauthorized, "Unauthorized: this endpoint needs an agent access token (the access_token from register)")
		return nil
	}
	a := s.agents[id]
	if a.revoked {
		writeError(w, http.StatusUnauthorized, "Unauthorized: this agent's access token has been revoked")
		return nil
	}
	return a
}

// authJobLocked returns the job named in the path if the request carries that job's token, or
// writes 401 (wrong kind of token, or another job's token) or 404.
func (s *Server) authJobLocked(w http.ResponseWriter, r *http.Request) *job {
	tokJob, ok := s.jobToken[tokenOf(r)]
	if !ok {
		writeError(w, http.StatusUnauthorized, "Unauthorized: this endpoint needs the job's token (the token from accept)")
		return nil
	}
	id := r.PathValue("id")
	if tokJob != id {
		if _, exists := s.jobs[id]; !exists {
			writeError(w, http.StatusNotFound, "No job found with id %q", id)
			return nil
		}
		writeError(w, http.StatusUnauthorized, "Unauthorized: this job token belongs to another job")
		return nil
	}
	return s.jobs[id]
}

// noBody is the request type of endpoints whose body the fake ignores: GET and DELETE send
// none, and decoding an empty body would refuse them with 422.
type noBody struct{}

// lockedHandler serves a token endpoint: a body that is not JSON gets 422 before the token is
// looked at, then fn runs under s.mu with what lookup found; lookup has already written the 401
// or 404 when it finds nothing.
func lockedHandler[T, Req any](s *Server, lookup func(http.ResponseWriter, *http.Request) *T,
	fn func(w http.ResponseWriter, r *http.Request, found *T, req *Req)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if _, ignore := any(req).(noBody); !ignore {
			if err := decodeJSON(r, &req); err != nil {
				writeError(w, http.StatusUnprocessableEntity, "%v", err)
				return
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		found := lookup(w, r)
		if found == nil {
			return
		}
		fn(w, r, found, &req)
	}
}

// agentHandler serves an endpoint that takes an agent's access token.
func agentHandler[Req any](s *Server, fn func(w http.ResponseWriter, r *http.Request, a *agent, req *Req)) http.HandlerFunc {
	return lockedHandler(s, s.authAgentLocked, fn)
}

// jobHandler serves an endpoint that takes the token of the job in its path.
func jobHandler[Req any](s *Server, fn func(w http.ResponseWriter, r *http.Request, j *job, req *Req)) http.HandlerFunc {
	return lockedHandler(s, s.authJobLocked, fn)
}

// metaDataHandler serves a meta-data endpoint, which is about the build of the job or the
// build named in its path.
func metaDataHandler[Req any](s *Server, fn func(w http.ResponseWriter, r *http.Request, b *build, req *Req)) http.HandlerFunc {
	return lockedHandler(s, s.metaDataBuildLocked, fn)
}

type registerRequest struct {
	Name               string   `json:"name"`
	Hostname           string   `json:"hostname"`
	Version            string   `json:"version"`
	MetaData           []string `json:"meta_data"`
	IgnoreInDispatches bool     `json:"ignore_in_dispatches"`
	Features           []string `json:"features"`
}

var tagRE = regexp.MustCompile(`^[^=\s]+=`)

func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(tokenOf(r)), []byte(s.opts.RegistrationToken)) != 1 {
		writeError(w, http.StatusUnauthorized, "Invalid registration token: register with the agent registration token")
		return
	}
	var req registerRequest
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "%v", err)
		return
	}
	for _, t := range req.MetaData {
		if !tagRE.MatchString(t) {
			writeError(w, http.StatusUnprocessableEntity, "Invalid agent tag %q: tags are key=value", t)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &agent{
		id: newUUID(), name: req.Name, tags: append([]string(nil), req.MetaData...),
		state: AgentRegistered, action: ActionIdle, ignoreInDispatches: req.IgnoreInDispatches,
		registeredAt: time.Now(), version: req.Version, hostname: req.Hostname,
	}
	if a.name == "" {
		a.name = req.Hostname
	}
	if a.name == "" {
		a.name = "agent-" + a.id[:8]
	}
	tok := newToken("")
	s.agents[a.id] = a
	s.agentOrder = append(s.agentOrder, a.id)
	s.accessToken[tok] = a.id
	s.logf("fake buildkite: agent %s (%s) registered with tags %v", a.id, a.name, a.tags)
	s.notifyLocked()
	writeJSON(w, http.StatusCreated, map[string]any{
		"id":                  a.id,
		"name":                a.name,
		"access_token":        tok,
		"endpoint":            "",
		"request_headers":     map[string]string{},
		"ping_interval":       s.opts.PingInterval,
		"job_status_interval": s.opts.JobStatusInterval,
		"heartbeat_interval":  s.opts.HeartbeatInterval,
		"meta_data":           a.tags,
	})
}

func (s *Server) handleConnect(w http.ResponseWriter, _ *http.Request, a *agent, _ *noBody) {
	a.state = AgentConnected
	a.lastPing = time.Now()
	s.notifyLocked()
	writeJSON(w, http.StatusOK, map[string]string{"id": a.id, "connection_state": "connected"})
}

func (s *Server) handleDisconnect(w http.ResponseWriter, _ *http.Request, a *agent, _ *noBody) {
	a.state = AgentDisconnected
	if j, ok := s.jobs[a.currentJob]; ok && j.state == StateAssigned && j.assignedTo == a.id {
		// Offered and never accepted: Buildkite dispatches it again, to another agent.
		j.state, j.assignedTo = StateScheduled, ""
		a.currentJob = ""
	}
	s.logf("fake buildkite: agent %s disconnected", a.id)
	s.notifyLocked()
	writeJSON(w, http.StatusOK, map[string]string{"id": a.id, "connection_state": "disconnected"})
}

func (s *Server) handleStop(w http.ResponseWriter, _ *http.Request, a *agent, _ *noBody) {
	a.state = AgentStopped
	s.notifyLocked()
	writeJSON(w, http.StatusOK, map[string]string{"id": a.id, "connection_state": "stopping"})
}

// handleHeartbeat's request type is unnamed on purpose: the 422 for a body that does not
// decode names the Go type, and this keeps that message as agents have always seen it.
func (s *Server) handleHeartbeat(w http.ResponseWriter, _ *http.Request, a *agent, req *struct {
	SentAt string `json:"sent_at"`
}) {
	a.lastHeartbeat = time.Now()
	s.notifyLocked()
	writeJSON(w, http.StatusOK, map[string]string{
		"sent_at":     req.SentAt,
		"received_at": a.lastHeartbeat.UTC().Format(time.RFC3339Nano),
	})
}

func (s *Server) handlePing(w http.ResponseWriter, _ *http.Request, a *agent, _ *noBody) {
	a.lastPing = time.Now()
	a.pingCount++
	defer s.notifyLocked()
	switch a.action {
	case ActionDisconnect:
		writeJSON(w, http.StatusOK, map[string]any{"action": ActionDisconnect, "message": disconnectMessage})
		return
	case ActionPause:
		writeJSON(w, http.StatusOK, map[string]any{"action": ActionPause, "message": pauseMessage})
		return
	case ActionStop:
		writeJSON(w, http.StatusOK, map[string]any{"action": ActionStop, "message": stopMessage})
		return
	}
	if a.currentJob != "" {
		j := s.jobs[a.currentJob]
		switch {
		case j.state == StateAssigned && j.assignedTo == a.id:
			// The agent pinged instead of accepting what it was offered (its accept failed, or it
			// dropped the job): Buildkite takes the job back and may offer it again.
			j.state, j.assignedTo = StateScheduled, ""
			a.currentJob = ""
		case IsTerminal(j.state):
			a.currentJob = ""
		default:
			// Still running a job: an agent runs one job at a time.
			writeJSON(w, http.StatusOK, map[string]any{"action": ActionIdle})
			return
		}
	}
	if a.state != AgentConnected || a.ignoreInDispatches {
		writeJSON(w, http.StatusOK, map[string]any{"action": ActionIdle})
		return
	}
	for _, id := range s.jobOrder {
		j := s.jobs[id]
		if j.state != StateScheduled || !rulesMatch(j.rules, a.tags) {
			continue
		}
		j.state, j.assignedTo = StateAssigned, a.id
		j.offeredVia = append(j.offeredVia, ViaPing)
		a.currentJob = j.id
		s.logf("fake buildkite: job %s assigned to agent %s", j.id, a.id)
		writeJSON(w, http.StatusOK, map[string]any{
			"action": ActionIdle,
			"job":    map[string]any{"id": j.id, "state": j.state, "runnable_at": j.createdAt.UTC().Format(time.RFC3339Nano)},
		})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": ActionIdle})
}

func (s *Server) handleAccept(w http.ResponseWriter, r *http.Request, a *agent, _ *noBody) {
	if j := s.pathJobLocked(w, r); j != nil {
		s.acceptJobLocked(w, j, a)
	}
}

// handleAcquire serves --acquire-job agents: they take a named job without a ping.
func (s *Server) handleAcquire(w http.ResponseWriter, r *http.Request, a *agent, _ *noBody) {
	j := s.pathJobLocked(w, r)
	if j == nil {
		return
	}
	// A scheduled job is not a retry (acceptJobLocked checks that first), so assigning it here
	// answers as checking for a retry first would.
	if j.state == StateScheduled {
		if !rulesMatch(j.rules, a.tags) {
			writeError(w, http.StatusUnprocessableEntity, "Job's agent query rules %v do not match this agent's tags %v", j.rules, a.tags)
			return
		}
		j.state, j.assignedTo = StateAssigned, a.id
		j.offeredVia = append(j.offeredVia, ViaAcquire)
	}
	s.acceptJobLocked(w, j, a)
}

// pathJobLocked returns the job named in the path, or writes 404.
func (s *Server) pathJobLocked(w http.ResponseWriter, r *http.Request) *job {
	j, ok := s.jobs[r.PathValue("id")]
	if !ok {
		writeError(w, http.StatusNotFound, "No job found with id %q", r.PathValue("id"))
		return nil
	}
	return j
}

// acceptJobLocked answers accept and acquire: the job again to a retry of an accept whose
// response was lost, 422 to an agent that may not take the job, else the job it takes.
func (s *Server) acceptJobLocked(w http.ResponseWriter, j *job, a *agent) {
	if j.acceptedBy == a.id && (j.state == StateAccepted || j.state == StateRunning) {
		writeJSON(w, http.StatusOK, s.jobJSONLocked(j))
		return
	}
	if reject := acceptRejection(j, a.id); reject != "" {
		writeError(w, http.StatusUnprocessableEntity, "%s", reject)
		return
	}
	s.acceptLocked(j, a)
	writeJSON(w, http.StatusOK, s.jobJSONLocked(j))
}

// acceptRejection says why agent may not accept j, or "" if it may.
func acceptRejection(j *job, agentID string) string {
	switch j.state {
	case StateAssigned:
		if j.assignedTo == agentID {
			return ""
		}
		return "Job has already been assigned to another agent"
	case StateScheduled:
		return "Job has not been assigned to this agent: accept only the job a ping returned"
	case StateAccepted, StateRunning, StateTimingOut:
		return "Job has already been accepted by another agent"
	case StateCanceling, StateCanceled:
		return "Job has already been canceled"
	default:
		return "Job has already finished"
	}
}

func (s *Server) acceptLocked(j *job, a *agent) {
	if n := len(j.offeredVia); n > 0 {
		j.acceptedVia = j.offeredVia[n-1] // the offer the agent took: the latest
	}
	j.state, j.acceptedBy, j.assignedTo = StateAccepted, a.id, a.id
	j.acceptedAt = time.Now()
	j.acceptCount++
	j.token = newToken("bkaj_")
	s.jobToken[j.token] = j.id
	a.currentJob = j.id
	// Accepting applies the agent's environment to the job.
	j.env["BUILDKITE_AGENT_ID"] = a.id
	j.env["BUILDKITE_AGENT_NAME"] = a.name
	for _, t := range a.tags {
		k, v, _ := strings.Cut(t, "=")
		j.env["BUILDKITE_AGENT_META_DATA_"+envName(k)] = v
	}
	s.logf("fake buildkite: job %s accepted by agent %s", j.id, a.id)
	s.notifyLocked()
}

// envName upper-cases a tag key and turns everything but letters and digits into "_".
func envName(k string) string {
	var b strings.Builder
	for _, c := range strings.ToUpper(k) {
		if (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// jobJSONLocked is the Job object of accept and acquire.
func (s *Server) jobJSONLocked(j *job) map[string]any {
	return map[string]any{
		"id":                      j.id,
		"endpoint":                "",
		"state":                   j.state,
		"env":                     j.env,
		"step":                    json.RawMessage(j.stepJSON),
		"chunks_max_size_bytes":   s.opts.ChunksMaxSizeBytes,
		"chunks_interval_seconds": s.opts.ChunksIntervalSeconds,
		"log_max_size_bytes":      s.opts.LogMaxSizeBytes,
		"token":                   j.token,
		"runnable_at":             j.createdAt.UTC().Format(time.RFC3339Nano),
	}
}
