package fakebuildkite

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
)

// startRequest is decoded only so that a malformed start gets 422.
type startRequest struct {
	StartedAt string `json:"started_at"`
}

func (s *Server) handleStart(w http.ResponseWriter, _ *http.Request, j *job, _ *startRequest) {
	switch j.state {
	case StateAccepted:
		j.state = StateRunning
		j.startedAt = time.Now()
		j.startCount++
		s.startTimeoutLocked(j)
	case StateRunning, StateCanceling, StateTimingOut:
		// A retried start: nothing changes.
		j.startCount++
	case StateCanceled:
		writeError(w, http.StatusUnprocessableEntity, "Job has already been canceled")
		return
	default:
		writeError(w, http.StatusUnprocessableEntity, "Job can't be started while it is %s", j.state)
		return
	}
	s.logf("fake buildkite: job %s started", j.id)
	s.notifyLocked()
	writeJSON(w, http.StatusOK, map[string]string{"id": j.id, "state": j.state})
}

func (s *Server) handleJobState(w http.ResponseWriter, _ *http.Request, j *job, _ *noBody) {
	writeJSON(w, http.StatusOK, map[string]string{"state": j.state})
}

func (s *Server) handleChunks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var nums [3]int64
	for i, name := range []string{"sequence", "offset", "size"} {
		n, err := strconv.ParseInt(q.Get(name), 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusUnprocessableEntity, "Chunk needs a %s query parameter (a non-negative integer), got %q", name, q.Get(name))
			return
		}
		nums[i] = n
	}
	seq, off, size := nums[0], nums[1], nums[2]
	if r.Header.Get("Content-Encoding") != "gzip" {
		writeError(w, http.StatusUnprocessableEntity, "Chunk body must be gzip-compressed and sent with Content-Encoding: gzip")
		return
	}
	zr, _ := gunzippers.Get().(*gzip.Reader)
	if zr == nil {
		zr = new(gzip.Reader)
	}
	defer gunzippers.Put(zr)
	if err := zr.Reset(io.LimitReader(r.Body, 64<<20)); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "Chunk body is not gzip: %v", err)
		return
	}
	// Read into a buffer of the size the query gives, one byte more to tell a longer body:
	// io.ReadAll would grow it from 512 bytes, copying a chunk several times over.
	data, err := readSized(io.LimitReader(zr, s.opts.ChunksMaxSizeBytes+1), min(size, s.opts.ChunksMaxSizeBytes)+1)
	if err != nil {
		writeError(w, http.StatusUnprocessableEntity, "Chunk body is not valid gzip: %v", err)
		return
	}
	if int64(len(data)) > s.opts.ChunksMaxSizeBytes {
		writeError(w, http.StatusUnprocessableEntity, "Chunk is larger than chunks_max_size_bytes (%d)", s.opts.ChunksMaxSizeBytes)
		return
	}
	if int64(len(data)) != size {
		writeError(w, http.StatusUnprocessableEntity, "Chunk size %d does not match its %d uncompressed bytes", size, len(data))
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.authJobLocked(w, r)
	if j == nil {
		return
	}
	if IsTerminal(j.state) || j.state == StateScheduled || j.state == StateAssigned {
		writeError(w, http.StatusUnprocessableEntity, "Job is %s and can't take log chunks", j.state)
		return
	}
	if j.log.add(chunk{sequence: int(seq), offset: off, data: data}) {
		s.notifyLocked()
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": newUUID(), "sequence": seq})
}

func (s *Server) handleHeaderTimes(w http.ResponseWriter, _ *http.Request, _ *job, _ *noBody) {
	writeJSON(w, http.StatusOK, map[string]string{})
}

type finishRequest struct {
	ExitStatus              json.RawMessage `json:"exit_status"`
	Signal                  string          `json:"signal"`
	SignalReason            string          `json:"signal_reason"`
	FinishedAt              string          `json:"finished_at"`
	ChunksFailedCount       int             `json:"chunks_failed_count"`
	IgnoreAgentInDispatches bool            `json:"ignore_agent_in_dispatches"`
}

func (s *Server) handleFinish(w http.ResponseWriter, r *http.Request) {
	var req finishRequest
	decodeErr := decodeJSON(r, &req)
	exitStatus := ""
	if decodeErr == nil && len(req.ExitStatus) > 0 && string(req.ExitStatus) != "null" {
		if err := json.Unmarshal(req.ExitStatus, &exitStatus); err != nil {
			decodeErr = fmt.Errorf("exit_status must be a JSON string such as \"0\", not %s", req.ExitStatus)
		} else if _, err := strconv.Atoi(exitStatus); err != nil {
			decodeErr = fmt.Errorf("exit_status %q is not an integer", exitStatus)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.authJobLocked(w, r)
	if j == nil {
		return
	}
	j.finishCount++
	s.notifyLocked()
	if decodeErr != nil {
		writeError(w, http.StatusUnprocessableEntity, "%v", decodeErr)
		return
	}
	switch j.state {
	case StateAccepted, StateRunning:
		j.state = StateFinished
	case StateCanceling:
		j.state = StateCanceled
	case StateTimingOut:
		j.state = StateTimedOut
	case StateCanceled:
		j.finishesRefused++
		writeError(w, http.StatusUnprocessableEntity, "Job has already been canceled")
		return
	default:
		j.finishesRefused++
		writeError(w, http.StatusUnprocessableEntity, "Job has already finished")
		return
	}
	j.finishesAccepted++
	j.exitStatus, j.signal, j.signalReason = exitStatus, req.Signal, req.SignalReason
	j.chunksFailedCount = req.ChunksFailedCount
	j.finishedAt = time.Now()
	if a, ok := s.agents[j.acceptedBy]; ok {
		if a.currentJob == j.id {
			a.currentJob = ""
		}
		if req.IgnoreAgentInDispatches {
			a.ignoreInDispatches = true
		}
	}
	s.logf("fake buildkite: job %s %s with exit status %q signal %q reason %q", j.id, j.state, exitStatus, req.Signal, req.SignalReason)
	s.notifyLocked() // the agent is free: a job may be pushed to it
	writeJSON(w, http.StatusOK, map[string]string{"id": j.id, "state": j.state})
}

// metaDataBuildLocked returns the build whose meta-data a jobs/{id} or builds/{id} call is
// about. Meta-data belongs to the build: every job of it sees the same keys.
func (s *Server) metaDataBuildLocked(w http.ResponseWriter, r *http.Request) *build {
	if strings.HasPrefix(r.URL.Path, "/v3/builds/") {
		if _, ok := s.jobToken[tokenOf(r)]; !ok {
			writeError(w, http.StatusUnauthorized, "Unauthorized: this endpoint needs a job token")
			return nil
		}
		b, ok := s.builds[r.PathValue("id")]
		if !ok {
			writeError(w, http.StatusNotFound, "No build found with id %q", r.PathValue("id"))
			return nil
		}
		return b
	}
	j := s.authJobLocked(w, r)
	if j == nil {
		return nil
	}
	return s.builds[j.buildID]
}

type metaDataItem struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

func (s *Server) handleMetaDataSet(w http.ResponseWriter, _ *http.Request, b *build, req *metaDataItem) {
	if msg := validateMetaData(*req); msg != "" {
		writeError(w, http.StatusUnprocessableEntity, "%s", msg)
		return
	}
	b.metaData[req.Key] = req.Value
	s.notifyLocked()
	writeJSON(w, http.StatusCreated, req)
}

func validateMetaData(it metaDataItem) string {
	if it.Key == "" {
		return "Key can't be blank"
	}
	if it.Value == "" {
		return fmt.Sprintf("Value for key %q can't be blank", it.Key)
	}
	return ""
}

type metaDataBatch struct {
	Items []metaDataItem `json:"items"`
}

func (s *Server) handleMetaDataSetBatch(w http.ResponseWriter, _ *http.Request, b *build, req *metaDataBatch) {
	if len(req.Items) == 0 {
		writeError(w, http.StatusUnprocessableEntity, "Items can't be empty")
		return
	}
	for _, it := range req.Items {
		if msg := validateMetaData(it); msg != "" {
			writeError(w, http.StatusUnprocessableEntity, "%s", msg)
			return
		}
	}
	for _, it := range req.Items {
		b.metaData[it.Key] = it.Value
	}
	s.notifyLocked()
	writeJSON(w, http.StatusCreated, req)
}

func (s *Server) handleMetaDataGet(w http.ResponseWriter, _ *http.Request, b *build, req *metaDataItem) {
	v, ok := b.metaData[req.Key]
	if !ok {
		writeError(w, http.StatusNotFound, "No key %q found", req.Key)
		return
	}
	writeJSON(w, http.StatusOK, metaDataItem{Key: req.Key, Value: v})
}

func (s *Server) handleMetaDataExists(w http.ResponseWriter, _ *http.Request, b *build, req *metaDataItem) {
	_, ok := b.metaData[req.Key]
	writeJSON(w, http.StatusOK, map[string]bool{"exists": ok})
}

func (s *Server) handleMetaDataKeys(w http.ResponseWriter, _ *http.Request, b *build, _ *noBody) {
	keys := make([]string, 0, len(b.metaData))
	for k := range b.metaData {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	writeJSON(w, http.StatusOK, keys)
}

// Annotation scopes, as the agent's --scope flag names them: a build-scoped annotation
// shows at the top of the build, a job-scoped one on its job.
const (
	scopeBuild = "build"
	scopeJob   = "job"
)

// defaultPriority is the priority of an annotation written without one, as the agent's
// --priority flag defaults.
const defaultPriority = 3

// annotationsLocked returns where the annotations of scope live for job j: the build's
// or the job's own. ok is false (and the 422 written) for an unknown scope.
func (s *Server) annotationsLocked(w http.ResponseWriter, j *job, scope string) (anns *[]*annotation, ok bool) {
	switch scope {
	case "", scopeBuild:
		return &s.builds[j.buildID].annotations, true
	case scopeJob:
		return &j.annotations, true
	}
	writeError(w, http.StatusUnprocessableEntity, "Scope %q is not one of build, job", scope)
	return nil, false
}

func (s *Server) handleAnnotate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Body     string `json:"body"`
		Context  string `json:"context"`
		Style    string `json:"style"`
		Append   bool   `json:"append"`
		Priority int    `json:"priority"`
		Scope    string `json:"scope"`
	}
	if err := decodeJSON(r, &req); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "%v", err)
		return
	}
	switch req.Style {
	case "", "success", "info", "warning", "error":
	default:
		writeError(w, http.StatusUnprocessableEntity, "Style %q is not one of success, info, warning, error", req.Style)
		return
	}
	if req.Priority < 0 || req.Priority > 10 {
		writeError(w, http.StatusUnprocessableEntity, "Priority %d is not between 1 and 10", req.Priority)
		return
	}
	if req.Priority == 0 {
		req.Priority = defaultPriority
	}
	if req.Context == "" {
		req.Context = "default"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.authJobLocked(w, r)
	if j == nil {
		return
	}
	anns, ok := s.annotationsLocked(w, j, req.Scope)
	if !ok {
		return
	}
	for _, a := range *anns {
		if a.Context == req.Context {
			if req.Append {
				a.Body += req.Body
			} else {
				a.Body = req.Body
			}
			if req.Style != "" {
				a.Style = req.Style
			}
			a.priority = req.Priority
			s.notifyLocked()
			writeJSON(w, http.StatusOK, a.Annotation)
			return
		}
	}
	a := &annotation{Annotation: Annotation{Context: req.Context, Style: req.Style, Body: req.Body}, priority: req.Priority}
	if a.Style == "" {
		a.Style = "default"
	}
	*anns = append(*anns, a)
	s.notifyLocked()
	writeJSON(w, http.StatusCreated, a.Annotation)
}

func (s *Server) handleAnnotationRemove(w http.ResponseWriter, r *http.Request, j *job, _ *noBody) {
	anns, ok := s.annotationsLocked(w, j, r.URL.Query().Get("scope"))
	if !ok {
		return
	}
	ctx := r.PathValue("context")
	for i, a := range *anns {
		if a.Context == ctx {
			*anns = slices.Delete(*anns, i, i+1)
			s.notifyLocked()
			writeJSON(w, http.StatusOK, map[string]string{"context": ctx})
			return
		}
	}
	writeError(w, http.StatusNotFound, "No annotation found with context %q", ctx)
}

type pipelineUploadRequest struct {
	UUID     string          `json:"uuid"`
	Pipeline json.RawMessage `json:"pipeline"`
	Replace  bool            `json:"replace"`
}

func (s *Server) handlePipelineUpload(w http.ResponseWriter, r *http.Request, j *job, req *pipelineUploadRequest) {
	async := r.URL.Query().Get("async") == "true"
	if req.UUID == "" {
		writeError(w, http.StatusUnprocessableEntity, "Pipeline upload needs a uuid")
		return
	}
	if IsTerminal(j.state) {
		writeError(w, http.StatusUnprocessableEntity, "Job is %s: pipelines can only be uploaded from a running job", j.state)
		return
	}
	b := s.builds[j.buildID]
	if _, seen := b.uploads[req.UUID]; !seen {
		if len(req.Pipeline) == 0 || string(req.Pipeline) == "null" {
			writeError(w, http.StatusUnprocessableEntity, "Pipeline upload has no pipeline")
			return
		}
		specs, err := parseSteps(req.Pipeline)
		if err != nil {
			writeError(w, http.StatusUnprocessableEntity, "Pipeline upload rejected: %v", err)
			return
		}
		ids, err := s.addJobsLocked(b, specs, j.id)
		if err != nil {
			writeError(w, http.StatusUnprocessableEntity, "Pipeline upload rejected: %v", err)
			return
		}
		b.uploads[req.UUID] = &pipelineUpload{uuid: req.UUID, jobID: j.id, state: "applied", jobs: ids}
		s.logf("fake buildkite: job %s uploaded a pipeline: %d new job(s)", j.id, len(ids))
		s.notifyLocked()
	}
	if !async {
		writeJSON(w, http.StatusCreated, map[string]string{"uuid": req.UUID, "state": "applied"})
		return
	}
	w.Header().Set("Location", fmt.Sprintf("%s/v3/jobs/%s/pipelines/%s", s.baseURL, j.id, req.UUID))
	w.Header().Set("Retry-After", "0")
	writeJSON(w, http.StatusAccepted, map[string]string{"uuid": req.UUID, "state": "pending"})
}

func (s *Server) handlePipelineStatus(w http.ResponseWriter, r *http.Request, j *job, _ *noBody) {
	u, ok := s.builds[j.buildID].uploads[r.PathValue("uuid")]
	if !ok || u.jobID != j.id {
		writeError(w, http.StatusNotFound, "No pipeline upload %q for this job", r.PathValue("uuid"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"state": u.state, "message": u.message})
}

// PipelineUploads returns the job ids each pipeline upload of a build created, by upload uuid.
func (s *Server) PipelineUploads(buildID string) map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	if b, ok := s.builds[buildID]; ok {
		for id, u := range b.uploads {
			out[id] = append([]string(nil), u.jobs...)
		}
	}
	return out
}

// gunzippers are the gzip readers of chunk bodies, reused: a reader holds tens of KiB. They
// are klauspost/compress's (the agent's own compressor's module), whose decompression takes
// a fraction of the standard library's time: in a benchmark streaming a log to the fake, the
// fake's gunzip competes with what is measured for the same cores.
var gunzippers sync.Pool

// readSized reads r to its end into a buffer of capacity hint, grown only if r holds more.
func readSized(r io.Reader, hint int64) ([]byte, error) {
	b := make([]byte, 0, hint)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
