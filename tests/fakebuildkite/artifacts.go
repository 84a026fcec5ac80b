package fakebuildkite

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"path"
	"time"
)

type artifact struct {
	id, jobID, buildID, batchID string
	path, absolutePath          string
	globPath                    string
	fileSize                    int64
	sha1, sha256                string
	state                       string // new, finished, error
	content                     []byte
	uploaded                    bool
	createdAt                   time.Time
}

// ArtifactSnapshot is a copy of an artifact's record and, once uploaded, its content.
type ArtifactSnapshot struct {
	ID        string `json:"id"`
	JobID     string `json:"job_id"`
	BuildID   string `json:"build_id"`
	Path      string `json:"path"`
	State     string `json:"state"`
	FileSize  int64  `json:"file_size"`
	Sha1Sum   string `json:"sha1sum"`
	Sha256Sum string `json:"sha256sum"`
	Uploaded  bool   `json:"uploaded"`
	Content   []byte `json:"-"`
}

// Artifacts returns the artifacts of one job ("" for every job), in creation order.
func (s *Server) Artifacts(jobID string) []ArtifactSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ArtifactSnapshot
	for _, id := range s.artifactOrder {
		a := s.artifacts[id]
		if jobID != "" && a.jobID != jobID {
			continue
		}
		out = append(out, ArtifactSnapshot{
			ID: a.id, JobID: a.jobID, BuildID: a.buildID, Path: a.path, State: a.state,
			FileSize: a.fileSize, Sha1Sum: a.sha1, Sha256Sum: a.sha256, Uploaded: a.uploaded,
			Content: append([]byte(nil), a.content...),
		})
	}
	return out
}

type artifactJSON struct {
	ID                string `json:"id,omitempty"`
	Path              string `json:"path"`
	AbsolutePath      string `json:"absolute_path"`
	GlobPath          string `json:"glob_path"`
	FileSize          int64  `json:"file_size"`
	Sha1Sum           string `json:"sha1sum"`
	Sha256Sum         string `json:"sha256sum"`
	JobID             string `json:"job_id,omitempty"`
	State             string `json:"state,omitempty"`
	URL               string `json:"url,omitempty"`
	UploadDestination string `json:"upload_destination,omitempty"`
	CreatedAt         string `json:"created_at,omitempty"`
}

type artifactBatch struct {
	ID                string         `json:"id"`
	Artifacts         []artifactJSON `json:"artifacts"`
	UploadDestination string         `json:"upload_destination"`
}

func (s *Server) handleArtifactsCreate(w http.ResponseWriter, _ *http.Request, j *job, req *artifactBatch) {
	if req.ID == "" {
		writeError(w, http.StatusUnprocessableEntity, "Artifact batch needs an id")
		return
	}
	if len(req.Artifacts) == 0 {
		writeError(w, http.StatusUnprocessableEntity, "Artifact batch has no artifacts")
		return
	}
	ids, seen := s.batches[req.ID]
	if !seen {
		for _, in := range req.Artifacts {
			if in.Path == "" {
				writeError(w, http.StatusUnprocessableEntity, "Artifact path can't be blank")
				return
			}
		}
		for _, in := range req.Artifacts {
			a := &artifact{
				id: newUUID(), jobID: j.id, buildID: j.buildID, batchID: req.ID, path: in.Path,
				absolutePath: in.AbsolutePath, globPath: in.GlobPath, fileSize: in.FileSize,
				sha1: in.Sha1Sum, sha256: in.Sha256Sum, state: "new", createdAt: time.Now(),
			}
			s.artifacts[a.id] = a
			s.artifactOrder = append(s.artifactOrder, a.id)
			ids = append(ids, a.id)
		}
		s.batches[req.ID] = ids
		s.notifyLocked()
	}
	// S3-style form upload instructions that point back at the fake. The agent replaces
	// ${artifact:path} in the form data with each artifact's path, which is how the upload
	// handler knows which artifact a file is.
	writeJSON(w, http.StatusCreated, map[string]any{
		"id":           req.ID,
		"artifact_ids": ids,
		"upload_instructions": map[string]any{
			"data": map[string]string{"key": "${artifact:path}"},
			"action": map[string]string{
				"url":        s.baseURL,
				"method":     "POST",
				"path":       "/_artifacts/upload/" + j.id + "/" + req.ID,
				"file_input": "file",
			},
		},
	})
}

func (s *Server) handleArtifactUpload(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseMultipartForm(32 << 20); err != nil {
		http.Error(w, "artifact upload must be multipart/form-data: "+err.Error(), http.StatusBadRequest)
		return
	}
	key := r.FormValue("key")
	f, _, err := r.FormFile("file")
	if err != nil {
		http.Error(w, "artifact upload has no file field: "+err.Error(), http.StatusBadRequest)
		return
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(f)
	if err != nil {
		http.Error(w, "reading artifact upload: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.batches[r.PathValue("batch")] {
		a := s.artifacts[id]
		if a.path != key || a.jobID != r.PathValue("job") {
			continue
		}
		if int64(len(data)) != a.fileSize {
			http.Error(w, "artifact size does not match the size given at create", http.StatusBadRequest)
			return
		}
		if a.sha1 != "" {
			sum := sha1.Sum(data)
			if hex.EncodeToString(sum[:]) != a.sha1 {
				http.Error(w, "artifact sha1 does not match the sha1sum given at create", http.StatusBadRequest)
				return
			}
		}
		if a.sha256 != "" {
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != a.sha256 {
				http.Error(w, "artifact sha256 does not match the sha256sum given at create", http.StatusBadRequest)
				return
			}
		}
		a.content, a.uploaded = data, true
		s.notifyLocked()
		w.WriteHeader(http.StatusCreated)
		return
	}
	http.Error(w, "no artifact "+key+" in this batch", http.StatusNotFound)
}

type artifactStates struct {
	Artifacts []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"artifacts"`
}

func (s *Server) handleArtifactsUpdate(w http.ResponseWriter, _ *http.Request, j *job, req *artifactStates) {
	for _, u := range req.Artifacts {
		a, ok := s.artifacts[u.ID]
		if !ok || a.jobID != j.id {
			writeError(w, http.StatusNotFound, "No artifact %q for this job", u.ID)
			return
		}
		if u.State != "finished" && u.State != "error" {
			writeError(w, http.StatusUnprocessableEntity, "Artifact state %q is not finished or error", u.State)
			return
		}
	}
	for _, u := range req.Artifacts {
		s.artifacts[u.ID].state = u.State
	}
	s.notifyLocked()
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (s *Server) handleArtifactsSearch(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.jobToken[tokenOf(r)]; !ok {
		writeError(w, http.StatusUnauthorized, "Unauthorized: this endpoint needs a job token")
		return
	}
	bid := r.PathValue("id")
	if _, ok := s.builds[bid]; !ok {
		writeError(w, http.StatusNotFound, "No build found with id %q", bid)
		return
	}
	q := r.URL.Query()
	query, state := q.Get("query"), q.Get("state")
	if state == "" {
		state = "finished"
	}
	out := []artifactJSON{}
	for _, id := range s.artifactOrder {
		a := s.artifacts[id]
		if a.buildID != bid || a.state != state {
			continue
		}
		if query != "" {
			if ok, _ := path.Match(query, a.path); !ok && query != a.path {
				continue
			}
		}
		out = append(out, artifactJSON{
			ID: a.id, Path: a.path, AbsolutePath: a.absolutePath, GlobPath: a.globPath,
			FileSize: a.fileSize, Sha1Sum: a.sha1, Sha256Sum: a.sha256, JobID: a.jobID, State: a.state,
			URL: s.baseURL + "/_artifacts/" + a.id, CreatedAt: a.createdAt.UTC().Format(time.RFC3339Nano),
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleArtifactDownload(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	a, ok := s.artifacts[r.PathValue("artifact")]
	var data []byte
	if ok {
		data = append([]byte(nil), a.content...)
		ok = a.uploaded
	}
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(data)
}
