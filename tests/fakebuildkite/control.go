package fakebuildkite

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strconv"
	"strings"
)

// JobView is the control API's JSON for a job: the snapshot with its log as text.
type JobView struct {
	JobSnapshot
	Log string `json:"log"`
	// PlainLog is the log without ANSI escapes and timestamps.
	PlainLog string `json:"plain_log"`
}

func jobView(j JobSnapshot) JobView {
	return JobView{JobSnapshot: j, Log: string(j.Log), PlainLog: PlainLog(j.Log)}
}

// controlRoutes serves the JSON control API under /control/ and the read-only web page at "/".
// It has no authentication: the fake listens on loopback by default and holds no secrets.
func (s *Server) controlRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /control/builds", func(w http.ResponseWriter, r *http.Request) {
		var req BuildRequest
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		b, err := s.CreateBuild(req)
		if err != nil {
			writeError(w, http.StatusUnprocessableEntity, "%v", err)
			return
		}
		writeJSON(w, http.StatusCreated, b)
	})
	mux.HandleFunc("GET /control/builds", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Builds())
	})
	mux.HandleFunc("GET /control/builds/{id}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := s.Build(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "no build %q", r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, b)
	})
	mux.HandleFunc("GET /control/jobs", func(w http.ResponseWriter, r *http.Request) {
		jobs := s.Jobs()
		out := make([]JobView, 0, len(jobs))
		for _, j := range jobs {
			out = append(out, jobView(j))
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /control/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		j, ok := s.Job(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "no job %q", r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, jobView(j))
	})
	mux.HandleFunc("GET /control/jobs/{id}/log", func(w http.ResponseWriter, r *http.Request) {
		j, ok := s.Job(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "no job %q", r.PathValue("id"))
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(j.Log)
	})
	mux.HandleFunc("POST /control/jobs/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		if err := s.CancelJob(r.PathValue("id")); err != nil {
			writeError(w, http.StatusUnprocessableEntity, "%v", err)
			return
		}
		j, _ := s.Job(r.PathValue("id"))
		writeJSON(w, http.StatusOK, jobView(j))
	})
	mux.HandleFunc("GET /control/agents", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Agents())
	})
	mux.HandleFunc("POST /control/agents/{id}/action", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Action string `json:"action"`
		}
		if err := decodeJSON(r, &req); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		if err := s.SendAgentAction(r.PathValue("id"), req.Action); err != nil {
			writeError(w, http.StatusUnprocessableEntity, "%v", err)
			return
		}
		a, _ := s.Agent(r.PathValue("id"))
		writeJSON(w, http.StatusOK, a)
	})
	mux.HandleFunc("POST /control/agents/{id}/revoke", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.Agent(r.PathValue("id")); !ok {
			writeError(w, http.StatusNotFound, "no agent %q", r.PathValue("id"))
			return
		}
		s.RevokeAgent(r.PathValue("id"))
		a, _ := s.Agent(r.PathValue("id"))
		writeJSON(w, http.StatusOK, a)
	})
	mux.HandleFunc("POST /control/faults", func(w http.ResponseWriter, r *http.Request) {
		var f Fault
		if err := decodeJSON(r, &f); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		if f.Endpoint == "" {
			writeError(w, http.StatusBadRequest, "a fault needs an endpoint, e.g. \"ping\" or \"*\"")
			return
		}
		s.Inject(f)
		writeJSON(w, http.StatusCreated, f)
	})
	mux.HandleFunc("DELETE /control/faults", func(w http.ResponseWriter, r *http.Request) {
		s.ClearFaults()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /control/requests", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Requests())
	})

	// Everything else: the web page, build pages at the BUILDKITE_BUILD_URL path, and JSON 404s
	// for unknown agent API paths.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		switch {
		case strings.HasPrefix(r.URL.Path, "/v3/") || strings.HasPrefix(r.URL.Path, "/control/"):
			writeError(w, http.StatusNotFound, "Not Found: the fake has no endpoint %s %s", r.Method, r.URL.Path)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			writeError(w, http.StatusMethodNotAllowed, "the web page is read-only")
		case r.URL.Path == "/":
			s.handleIndex(w, r)
		case len(parts) == 4 && parts[2] == "builds":
			s.handleBuildPage(w, r, parts[0], parts[1], parts[3])
		default:
			http.NotFound(w, r)
		}
	})
}

type pageData struct {
	Builds []pageBuild
	Agents []AgentSnapshot
}

type pageBuild struct {
	BuildSnapshot
	Jobs []JobView
}

func (s *Server) pageBuilds(keep func(BuildSnapshot) bool) []pageBuild {
	var out []pageBuild
	builds := s.Builds()
	for i := len(builds) - 1; i >= 0; i-- { // newest first, as Buildkite lists them
		b := builds[i]
		if !keep(b) {
			continue
		}
		pb := pageBuild{BuildSnapshot: b}
		for _, id := range b.Jobs {
			if j, ok := s.Job(id); ok {
				pb.Jobs = append(pb.Jobs, jobView(j))
			}
		}
		out = append(out, pb)
	}
	return out
}

func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	s.renderPage(w, pageData{Builds: s.pageBuilds(func(BuildSnapshot) bool { return true }), Agents: s.Agents()})
}

func (s *Server) handleBuildPage(w http.ResponseWriter, r *http.Request, org, pipe, number string) {
	n, _ := strconv.Atoi(number)
	builds := s.pageBuilds(func(b BuildSnapshot) bool {
		return b.Org == org && b.Pipeline == pipe && b.Number == n
	})
	if len(builds) == 0 {
		http.NotFound(w, r)
		return
	}
	s.renderPage(w, pageData{Builds: builds})
}

func (s *Server) renderPage(w http.ResponseWriter, d pageData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pageTmpl.Execute(w, d); err != nil {
		s.logf("fake buildkite: render page: %v", err)
	}
}

// The page escapes everything through html/template; logs are shown without ANSI escapes.
var pageTmpl = template.Must(template.New("page").Funcs(template.FuncMap{
	"json": func(v any) string { b, _ := json.Marshal(v); return string(b) },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="3">
<title>Fake Buildkite</title>
<style>
body{font-family:sans-serif;margin:1em 2em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
pre{background:#111;color:#eee;padding:8px;overflow:auto;max-height:30em}
.finished{color:green}.canceled,.timed_out,.canceling,.timing_out{color:#b60}.running{color:#06c}
</style></head><body>
<h1>Fake Buildkite</h1>
{{if .Agents}}<h2>Agents</h2>
<table><tr><th>name</th><th>id</th><th>state</th><th>tags</th><th>current job</th><th>last ping</th></tr>
{{range .Agents}}<tr><td>{{.Name}}</td><td>{{.ID}}</td><td>{{.State}}{{if .Revoked}} (revoked){{end}}</td><td>{{range .Tags}}{{.}} {{end}}</td><td>{{.CurrentJob}}</td><td>{{.LastPing.Format "15:04:05"}}</td></tr>
{{end}}</table>{{end}}
<h2>Builds</h2>
{{range .Builds}}
<h3><a href="{{.URL}}">{{.Org}}/{{.Pipeline}} #{{.Number}}</a> — {{.State}}</h3>
<p>{{.Message}} · {{.Branch}} · {{.Commit}} · {{.Repo}}</p>
{{if .MetaData}}<p>meta-data: {{json .MetaData}}</p>{{end}}
{{range .Annotations}}<p><b>annotation {{.Context}} ({{.Style}}):</b> {{.Body}}</p>{{end}}
{{range .Jobs}}
<h4>{{.Label}} <span class="{{.State}}">{{.State}}</span>{{if .ExitStatus}} exit {{.ExitStatus}}{{end}}{{if .SignalReason}} ({{.Signal}} {{.SignalReason}}){{end}}</h4>
{{range .Annotations}}<p><b>annotation {{.Context}} ({{.Style}}):</b> {{.Body}}</p>{{end}}
<p>job {{.ID}}{{if .StepKey}} · key {{.StepKey}}{{end}} · agents {{range .AgentQueryRules}}{{.}} {{end}}{{if .AcceptedBy}} · agent {{.AcceptedBy}}{{end}} · finish calls {{.FinishCount}}</p>
{{if .PlainLog}}<pre>{{.PlainLog}}</pre>{{end}}
{{end}}
{{else}}<p>No builds yet. Create one with <code>POST /control/builds</code>.</p>
{{end}}
</body></html>`))
