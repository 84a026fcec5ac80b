package fakebuildkite

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Endpoint names, for Fault.Endpoint and Request.Endpoint.
const (
	EPRegister        = "register"
	EPConnect         = "connect"
	EPPing            = "ping"
	EPStreamPings     = "stream_pings" // the streaming ping (see Fault for how faults apply to open streams)
	EPHeartbeat       = "heartbeat"
	EPStop            = "stop"
	EPDisconnect      = "disconnect"
	EPAccept          = "accept"
	EPStart           = "start"
	EPJobState        = "job_state"
	EPChunks          = "chunks"
	EPHeaderTimes     = "header_times"
	EPFinish          = "finish"
	EPMetaData        = "meta_data" // set, set-batch, get, exists and keys
	EPAnnotations     = "annotations"
	EPPipelineUpload  = "pipeline_upload"
	EPPipelineStatus  = "pipeline_status"
	EPArtifacts       = "artifacts" // create, update and search
	EPArtifactUpload  = "artifact_upload"
	EPArtifactContent = "artifact_download"
	EPSecrets         = "secrets"
	EPOIDCToken       = "oidc_token"
)

// Fault makes matching requests fail (or slow down) before the fake handles them, the way a
// load balancer or an overloaded Buildkite would.
//
// A fault whose Endpoint is EPStreamPings (by name: "*" leaves streams alone) with a Status
// or DropConnection also ends the streaming pings open when it is injected, each counting
// as one of its Times: DropConnection cuts a stream mid-way, Status ends it with the gRPC
// code of that status (503: unavailable, 404: unimplemented, 401: unauthenticated). Times
// left over apply to the streams opened later.
type Fault struct {
	// Endpoint is the endpoint name (the EP* constants, e.g. "ping", "accept", "chunks"), or "*"
	// for every agent API endpoint.
	Endpoint string `json:"endpoint"`
	// Status, when non-zero, is returned instead of handling the request, with
	// {"message": Message}.
	Status  int    `json:"status"`
	Message string `json:"message"`
	// RetryAfter, when non-zero, is sent as a Retry-After header (whole seconds, rounded up).
	RetryAfter time.Duration `json:"retry_after"`
	// Latency delays the request (and then the fault or the real handling).
	Latency time.Duration `json:"latency"`
	// DropConnection closes the connection without a response.
	DropConnection bool `json:"drop_connection"`
	// Times is how many requests the fault applies to; 0 means until ClearFaults.
	Times int `json:"times"`
	// JobID and AgentID, when set, restrict the fault to one job or one agent.
	JobID   string `json:"job_id"`
	AgentID string `json:"agent_id"`
}

type faultState struct {
	Fault
	left int // requests left; -1 for unlimited
	hits int
}

// Request is one request the agent API received, recorded for assertions.
type Request struct {
	Time     time.Time `json:"time"`
	Method   string    `json:"method"`
	Path     string    `json:"path"`
	Endpoint string    `json:"endpoint"`
	Status   int       `json:"status"` // 0 when the connection was dropped
	JobID    string    `json:"job_id,omitempty"`
	AgentID  string    `json:"agent_id,omitempty"`
	Faulted  bool      `json:"faulted,omitempty"`
}

// Inject adds a fault. Faults are checked in the order they were added; the first that matches
// a request applies.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := f.Times
	if left <= 0 {
		left = -1
	}
	fs := &faultState{Fault: f, left: left}
	if s.faultOpenStreamsLocked(fs) {
		s.faults = append(s.faults, fs)
	}
}

// ClearFaults removes every fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// Requests returns every agent API request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// RequestCount counts requests to one endpoint, optionally for one job ("" for any).
func (s *Server) RequestCount(endpoint, jobID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Endpoint == endpoint && (jobID == "" || r.JobID == jobID) {
			n++
		}
	}
	return n
}

// takeFaultLocked returns the fault that applies to this request, counting it as used.
func (s *Server) takeFaultLocked(endpoint, jobID, agentID string) *Fault {
	for i, f := range s.faults {
		if f.Endpoint != endpoint && f.Endpoint != "*" {
			continue
		}
		if f.JobID != "" && f.JobID != jobID {
			continue
		}
		if f.AgentID != "" && f.AgentID != agentID {
			continue
		}
		f.hits++
		if f.left > 0 {
			f.left--
			if f.left == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		cp := f.Fault
		return &cp
	}
	return nil
}

// agentIDForTokenLocked finds the agent behind a request's token, whatever its kind, for
// fault filters and request records.
func (s *Server) agentIDForTokenLocked(r *http.Request) string {
	tok := tokenOf(r)
	if id, ok := s.accessToken[tok]; ok {
		return id
	}
	if jid, ok := s.jobToken[tok]; ok {
		return s.jobs[jid].acceptedBy
	}
	return ""
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// endpoint wraps an agent API handler: it records the request and applies faults.
func (s *Server) endpoint(name string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		jobID := r.PathValue("id")
		if name == EPArtifactUpload || name == EPArtifactContent {
			jobID = r.PathValue("job")
		}
		s.mu.Lock()
		agentID := s.agentIDForTokenLocked(r)
		f := s.takeFaultLocked(name, jobID, agentID)
		idx := len(s.requests)
		s.requests = append(s.requests, Request{
			Time: time.Now(), Method: r.Method, Path: r.URL.Path, Endpoint: name,
			JobID: jobID, AgentID: agentID, Faulted: f != nil,
		})
		s.mu.Unlock()

		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			s.mu.Lock()
			s.requests[idx].Status = rec.status
			s.mu.Unlock()
		}()

		if f != nil {
			if f.Latency > 0 {
				select {
				case <-time.After(f.Latency):
				case <-r.Context().Done():
					return
				}
			}
			if f.DropConnection {
				s.logf("fake buildkite: fault: dropping connection of %s %s", r.Method, r.URL.Path)
				hj, ok := w.(http.Hijacker)
				if !ok {
					panic(http.ErrAbortHandler)
				}
				conn, _, err := hj.Hijack()
				if err == nil {
					_ = conn.Close()
				}
				return
			}
			if f.Status != 0 {
				s.logf("fake buildkite: fault: %d for %s %s", f.Status, r.Method, r.URL.Path)
				if f.RetryAfter > 0 {
					rec.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(f.RetryAfter.Seconds()))))
				}
				msg := f.Message
				if msg == "" {
					msg = fmt.Sprintf("Injected fault: %s", http.StatusText(f.Status))
				}
				writeError(rec, f.Status, "%s", msg)
				return
			}
		}
		h(rec, r)
	}
}
