package fakebuildkite

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The REST API part of the fake (api.buildkite.com/v2): the calls agentd's start-up check
// makes (pkg/preflight), as Buildkite's REST API documentation describes them. Its base
// URL is RESTEndpoint; tokens, organizations, clusters and queues are made with REST()'s
// methods or the control API under /control/rest/.
//
// As Buildkite does, it authenticates with "Authorization: Bearer <token>" (401 otherwise),
// checks the scope a call needs (403 "Your access token doesn't have the <scope> scope"),
// answers 404 "No organization found" for an organization the token was not granted,
// pages listings with page and per_page (30 by default, at most 100) and a Link header,
// and limits the rate of calls (SetRateLimit; Buildkite's 200 a minute by default), saying
// how much is left in RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset and
// answering 429 beyond it. The builds listings are restbuilds.go.

// Endpoint names of the REST API, for Fault.Endpoint and Request.Endpoint.
const (
	EPRESTAccessToken   = "rest_access_token"
	EPRESTOrganizations = "rest_organizations" // list and get
	EPRESTClusters      = "rest_clusters"      // list and get
	EPRESTQueues        = "rest_queues"        // list, get, pause_dispatch and resume_dispatch
	EPRESTBuilds        = "rest_builds"        // the builds listings of an organization and of a pipeline (restbuilds.go)
)

// REST API token scopes the fake knows.
const (
	ScopeReadOrganizations = "read_organizations"
	ScopeReadClusters      = "read_clusters"
	ScopeWriteClusters     = "write_clusters"
	ScopeReadBuilds        = "read_builds"
)

// APIToken is a REST API access token the fake takes.
type APIToken struct {
	Token string `json:"token"`
	// Scopes are the token's REST API scopes, such as read_clusters.
	Scopes []string `json:"scopes"`
	// Organizations are the slugs of the organizations the token was granted.
	Organizations []string `json:"organizations"`
	// UserName is who the token belongs to; "Fake User" when empty.
	UserName string `json:"user_name"`
}

// RESTAPI holds the fake's REST API state, apart from the agent API's, under its own lock.
// The builds listings read the agent API's builds and jobs while holding it: the lock
// order is RESTAPI.mu, then Server.mu, and nothing takes them the other way round. It is
// safe for concurrent use.
type RESTAPI struct {
	mu      sync.Mutex
	tokens  map[string]*restToken
	orgs    map[string]*restOrg // by slug
	orgList []string
	// pipelineClusters are the clusters pipelines are in, by "org/pipeline" (restbuilds.go).
	pipelineClusters map[string]string
	rate             rateLimit
}

// DefaultRESTRateLimit is Buildkite's REST API rate limit: 200 calls a minute for each
// organization, all its tokens and users together.
const DefaultRESTRateLimit = 200

// rateLimit counts calls in fixed windows, as Buildkite's RateLimit-Reset describes them.
type rateLimit struct {
	limit  int // calls a window; 0: DefaultRESTRateLimit
	window time.Duration
	start  time.Time // of the current window
	used   int
}

// SetRateLimit sets how many REST API calls the fake answers in each window (a minute when
// window is 0) before it answers 429, and starts a new window. The fake counts the calls
// of every token and organization together: a fake holds one organization, as tests do.
// A limit of 0 puts back Buildkite's (DefaultRESTRateLimit a minute).
func (r *RESTAPI) SetRateLimit(limit int, window time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if window <= 0 {
		window = time.Minute
	}
	r.rate = rateLimit{limit: limit, window: window}
}

// takeLocked counts one call, sets the RateLimit-* headers of its answer and reports
// whether it is within the limit.
func (rl *rateLimit) takeLocked(h http.Header, now time.Time) bool {
	if rl.limit <= 0 {
		rl.limit = DefaultRESTRateLimit
	}
	if rl.window <= 0 {
		rl.window = time.Minute
	}
	if rl.start.IsZero() || now.Sub(rl.start) >= rl.window {
		rl.start, rl.used = now, 0
	}
	ok := rl.used < rl.limit
	if ok {
		rl.used++
	}
	reset := rl.start.Add(rl.window).Sub(now)
	h.Set("RateLimit-Limit", strconv.Itoa(rl.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(rl.limit-rl.used))
	h.Set("RateLimit-Reset", strconv.Itoa(int(math.Ceil(reset.Seconds()))))
	return ok
}

type restToken struct {
	APIToken
	uuid    string
	created time.Time
}

type restOrg struct {
	id, slug string
	created  time.Time
	clusters []*restCluster
}

type restCluster struct {
	id, name string
	created  time.Time
	queues   []*restQueue
}

type restQueue struct {
	id, key  string
	created  time.Time
	paused   bool
	pausedBy string
	pausedAt time.Time
	note     string
}

// REST returns the fake's REST API state, to add tokens, organizations, clusters and queues.
func (s *Server) REST() *RESTAPI { return s.rest }

func newRESTAPI() *RESTAPI {
	return &RESTAPI{tokens: map[string]*restToken{}, orgs: map[string]*restOrg{}}
}

// RESTEndpoint is the REST API's base URL, as go-buildkite takes it (it adds v2/).
func (s *Server) RESTEndpoint() string { return s.URL() + "/" }

// AddToken makes t a token the REST API takes.
func (r *RESTAPI) AddToken(t APIToken) {
	if t.UserName == "" {
		t.UserName = "Fake User"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tokens[t.Token] = &restToken{APIToken: t, uuid: newUUID(), created: time.Now()}
}

// AddOrganization makes an organization of slug, unless there is one.
func (r *RESTAPI) AddOrganization(slug string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.orgLocked(slug)
}

func (r *RESTAPI) orgLocked(slug string) *restOrg {
	o, ok := r.orgs[slug]
	if !ok {
		o = &restOrg{id: newUUID(), slug: slug, created: time.Now()}
		r.orgs[slug] = o
		r.orgList = append(r.orgList, slug)
	}
	return o
}

// AddCluster makes a cluster named name in organization org (made too when there is none)
// and returns its UUID. Buildkite does not keep names unique, nor does the fake.
func (r *RESTAPI) AddCluster(org, name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &restCluster{id: newUUID(), name: name, created: time.Now()}
	o := r.orgLocked(org)
	o.clusters = append(o.clusters, c)
	return c.id
}

// AddQueue makes a queue of key in cluster (its name or UUID) of org, and returns its UUID.
func (r *RESTAPI) AddQueue(org, cluster, key string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.clusterLocked(org, cluster)
	if err != nil {
		return "", err
	}
	for _, q := range c.queues {
		if q.key == key {
			return "", fmt.Errorf("cluster %q already has a queue %q", c.name, key)
		}
	}
	q := &restQueue{id: newUUID(), key: key, created: time.Now()}
	c.queues = append(c.queues, q)
	return q.id, nil
}

// PauseQueue pauses dispatch on queue key of cluster (name or UUID) in org, with note, as
// the "Fake User" would from Buildkite's web page.
func (r *RESTAPI) PauseQueue(org, cluster, key, note string) error {
	return r.setPaused(org, cluster, key, true, "Fake User", note)
}

// ResumeQueue resumes dispatch on queue key of cluster (name or UUID) in org.
func (r *RESTAPI) ResumeQueue(org, cluster, key string) error {
	return r.setPaused(org, cluster, key, false, "", "")
}

func (r *RESTAPI) setPaused(org, cluster, key string, paused bool, by, note string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.clusterLocked(org, cluster)
	if err != nil {
		return err
	}
	for _, q := range c.queues {
		if q.key == key {
			q.setPaused(paused, by, note)
			return nil
		}
	}
	return fmt.Errorf("cluster %q of organization %q has no queue %q", c.name, org, key)
}

func (q *restQueue) setPaused(paused bool, by, note string) {
	q.paused, q.pausedBy, q.note, q.pausedAt = paused, by, note, time.Time{}
	if paused {
		q.pausedAt = time.Now().UTC().Truncate(time.Millisecond)
	}
}

// clusterLocked finds cluster (its UUID, else its name) in org.
func (r *RESTAPI) clusterLocked(org, cluster string) (*restCluster, error) {
	o, ok := r.orgs[org]
	if !ok {
		return nil, fmt.Errorf("no organization %q", org)
	}
	for _, c := range o.clusters {
		if c.id == cluster {
			return c, nil
		}
	}
	for _, c := range o.clusters {
		if c.name == cluster {
			return c, nil
		}
	}
	return nil, fmt.Errorf("organization %q has no cluster %q", org, cluster)
}

// restRoutes serves the REST API under /v2/ and its control API under /control/rest/.
func (s *Server) restRoutes(mux *http.ServeMux) {
	r := s.REST()
	api := func(pattern, name string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(pattern, " ")
		mux.HandleFunc(method+" /v2"+path, s.endpoint(name, h))
	}
	api("GET /access-token", EPRESTAccessToken, func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, "", "", func(t *restToken) (int, any) {
			return http.StatusOK, map[string]any{
				"uuid": t.uuid, "scopes": t.Scopes, "description": "fake token",
				"created_at": t.created.UTC().Format(time.RFC3339Nano),
				"user":       map[string]string{"name": t.UserName, "email": "fake-user@example.com"},
			}
		})
	})
	api("GET /organizations", EPRESTOrganizations, func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, ScopeReadOrganizations, "", func(t *restToken) (int, any) {
			var out []any
			for _, slug := range r.orgList {
				if slices.Contains(t.Organizations, slug) {
					out = append(out, r.orgJSON(s.URL(), r.orgs[slug]))
				}
			}
			return http.StatusOK, page(w, req, out)
		})
	})
	api("GET /organizations/{org}", EPRESTOrganizations, func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, ScopeReadOrganizations, req.PathValue("org"), func(t *restToken) (int, any) {
			return http.StatusOK, r.orgJSON(s.URL(), r.orgs[req.PathValue("org")])
		})
	})
	api("GET /organizations/{org}/clusters", EPRESTClusters, func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, ScopeReadClusters, req.PathValue("org"), func(t *restToken) (int, any) {
			o := r.orgs[req.PathValue("org")]
			out := make([]any, 0, len(o.clusters))
			for _, c := range o.clusters {
				out = append(out, clusterJSON(s.URL(), o.slug, c))
			}
			return http.StatusOK, page(w, req, out)
		})
	})
	api("GET /organizations/{org}/clusters/{cluster}", EPRESTClusters, func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, ScopeReadClusters, req.PathValue("org"), func(t *restToken) (int, any) {
			c := r.clusterByIDLocked(req.PathValue("org"), req.PathValue("cluster"))
			if c == nil {
				return http.StatusNotFound, map[string]string{"message": "No cluster found"}
			}
			return http.StatusOK, clusterJSON(s.URL(), req.PathValue("org"), c)
		})
	})
	api("GET /organizations/{org}/clusters/{cluster}/queues", EPRESTQueues, func(w http.ResponseWriter, req *http.Request) {
		r.serve(w, req, ScopeReadClusters, req.PathValue("org"), func(t *restToken) (int, any) {
			c := r.clusterByIDLocked(req.PathValue("org"), req.PathValue("cluster"))
			if c == nil {
				return http.StatusNotFound, map[string]string{"message": "No cluster found"}
			}
			out := make([]any, 0, len(c.queues))
			for _, q := range c.queues {
				out = append(out, queueJSON(s.URL(), req.PathValue("org"), c, q))
			}
			return http.StatusOK, page(w, req, out)
		})
	})
	api("GET /organizations/{org}/clusters/{cluster}/queues/{queue}", EPRESTQueues, func(w http.ResponseWriter, req *http.Request) {
		r.serveQueue(w, req, ScopeReadClusters, s.URL(), func(*restToken, *restQueue) {})
	})
	api("POST /organizations/{org}/clusters/{cluster}/queues/{queue}/pause_dispatch", EPRESTQueues, func(w http.ResponseWriter, req *http.Request) {
		var body struct {
			Note string `json:"dispatch_paused_note"`
		}
		if req.ContentLength != 0 {
			if err := decodeJSON(req, &body); err != nil {
				writeError(w, http.StatusBadRequest, "%v", err)
				return
			}
		}
		r.serveQueue(w, req, ScopeWriteClusters, s.URL(), func(t *restToken, q *restQueue) {
			q.setPaused(true, t.UserName, body.Note)
		})
	})
	api("POST /organizations/{org}/clusters/{cluster}/queues/{queue}/resume_dispatch", EPRESTQueues, func(w http.ResponseWriter, req *http.Request) {
		r.serveQueue(w, req, ScopeWriteClusters, s.URL(), func(_ *restToken, q *restQueue) {
			q.setPaused(false, "", "")
		})
	})
	s.restBuildsRoutes(api)
	// Any other REST path: Buildkite's JSON 404, not the web page's.
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, req *http.Request) {
		writeError(w, http.StatusNotFound, "Not Found: the fake has no REST endpoint %s %s", req.Method, req.URL.Path)
	})
	r.controlRoutes(mux)
}

// serve authenticates the request and checks its scope and organization (when org is not
// empty), then answers with what h returns, holding r.mu.
func (r *RESTAPI) serve(w http.ResponseWriter, req *http.Request, scope, org string, h func(*restToken) (int, any)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	tokenText, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	t, known := r.tokens[strings.TrimSpace(tokenText)]
	if !ok || !known {
		writeError(w, http.StatusUnauthorized, "Authentication required. Please supply a valid API Access Token: https://buildkite.com/docs/apis/rest-api#authentication")
		return
	}
	if !r.rate.takeLocked(w.Header(), time.Now()) {
		// The message is the fake's: what matters to a client is the 429 and RateLimit-Reset.
		writeError(w, http.StatusTooManyRequests, "You have made too many requests: the organization's REST API rate limit is %d a window; wait RateLimit-Reset seconds", r.rate.limit)
		return
	}
	if scope != "" && !slices.Contains(t.Scopes, scope) {
		writeError(w, http.StatusForbidden, "Your access token doesn't have the %s scope", scope)
		return
	}
	if org != "" {
		if _, exists := r.orgs[org]; !exists || !slices.Contains(t.Organizations, org) {
			writeError(w, http.StatusNotFound, "No organization found")
			return
		}
	}
	status, body := h(t)
	writeJSON(w, status, body)
}

// serveQueue serves one queue of the request's path, after change.
func (r *RESTAPI) serveQueue(w http.ResponseWriter, req *http.Request, scope, base string, change func(*restToken, *restQueue)) {
	org := req.PathValue("org")
	r.serve(w, req, scope, org, func(t *restToken) (int, any) {
		c := r.clusterByIDLocked(org, req.PathValue("cluster"))
		if c == nil {
			return http.StatusNotFound, map[string]string{"message": "No cluster found"}
		}
		for _, q := range c.queues {
			if q.id == req.PathValue("queue") {
				change(t, q)
				return http.StatusOK, queueJSON(base, org, c, q)
			}
		}
		return http.StatusNotFound, map[string]string{"message": "No queue found"}
	})
}

func (r *RESTAPI) clusterByIDLocked(org, id string) *restCluster {
	for _, c := range r.orgs[org].clusters {
		if c.id == id {
			return c
		}
	}
	return nil
}

func (r *RESTAPI) orgJSON(base string, o *restOrg) map[string]any {
	return map[string]any{
		"id": o.id, "graphql_id": "Org-" + o.id, "slug": o.slug, "name": o.slug,
		"url":        base + "/v2/organizations/" + o.slug,
		"web_url":    base + "/" + o.slug,
		"created_at": o.created.UTC().Format(time.RFC3339Nano),
	}
}

func clusterJSON(base, org string, c *restCluster) map[string]any {
	api := base + "/v2/organizations/" + org + "/clusters/" + c.id
	out := map[string]any{
		"id": c.id, "graphql_id": "Cluster-" + c.id, "name": c.name, "description": "",
		"url": api, "web_url": base + "/organizations/" + org + "/clusters/" + c.id,
		"queues_url": api + "/queues", "created_at": c.created.UTC().Format(time.RFC3339Nano),
		"created_by": fakeUser("Fake User"),
	}
	if len(c.queues) > 0 {
		out["default_queue_id"] = c.queues[0].id
		out["default_queue_url"] = api + "/queues/" + c.queues[0].id
	}
	return out
}

func queueJSON(base, org string, c *restCluster, q *restQueue) map[string]any {
	clusterAPI := base + "/v2/organizations/" + org + "/clusters/" + c.id
	out := map[string]any{
		"id": q.id, "graphql_id": "ClusterQueue-" + q.id, "key": q.key, "description": "",
		"url":                  clusterAPI + "/queues/" + q.id,
		"web_url":              base + "/organizations/" + org + "/clusters/" + c.id + "/queues/" + q.id,
		"cluster_url":          clusterAPI,
		"retry_agent_affinity": "prefer-warmest",
		"dispatch_paused":      q.paused,
		"dispatch_paused_by":   nil,
		"dispatch_paused_at":   nil,
		"dispatch_paused_note": nil,
		"created_at":           q.created.UTC().Format(time.RFC3339Nano),
		"created_by":           fakeUser("Fake User"),
	}
	if q.paused {
		out["dispatch_paused_by"] = fakeUser(q.pausedBy)
		out["dispatch_paused_at"] = q.pausedAt.Format(time.RFC3339Nano)
		if q.note != "" {
			out["dispatch_paused_note"] = q.note
		}
	}
	return out
}

func fakeUser(name string) map[string]any {
	return map[string]any{"id": "fake-user", "graphql_id": "User-fake-user", "name": name, "email": "fake-user@example.com"}
}

// page returns the page of items the request asks for (page, per_page), and links the
// other pages in a Link header, as Buildkite's REST API does.
func page(w http.ResponseWriter, req *http.Request, items []any) []any {
	n, _ := strconv.Atoi(req.URL.Query().Get("page"))
	per, _ := strconv.Atoi(req.URL.Query().Get("per_page"))
	n, per = max(n, 1), min(max(per, 0), 100)
	if per == 0 {
		per = 30
	}
	last := max((len(items)+per-1)/per, 1)
	link := func(p int, rel string) string {
		u := url.URL{Scheme: "http", Host: req.Host, Path: req.URL.Path}
		q := req.URL.Query()
		q.Set("page", strconv.Itoa(p))
		q.Set("per_page", strconv.Itoa(per))
		u.RawQuery = q.Encode()
		return fmt.Sprintf("<%s>; rel=%q", u.String(), rel)
	}
	var links []string
	if n < last {
		links = append(links, link(n+1, "next"), link(last, "last"))
	}
	if n > 1 {
		links = append(links, link(1, "first"), link(n-1, "prev"))
	}
	if len(links) > 0 {
		w.Header().Set("Link", strings.Join(links, ", "))
	}
	from := min((n-1)*per, len(items))
	out := items[from:min(from+per, len(items))]
	if out == nil {
		out = []any{}
	}
	return out
}

// controlRoutes serves the REST API's control API: the HTTP twins of AddToken, AddCluster,
// AddQueue, PauseQueue, ResumeQueue, SetPipelineCluster and SetRateLimit, for a fake run
// as a program.
func (r *RESTAPI) controlRoutes(mux *http.ServeMux) {
	type queueRef struct {
		Organization string `json:"organization"`
		Cluster      string `json:"cluster"` // name or UUID
		Key          string `json:"key"`
		Note         string `json:"note"`
	}
	mux.HandleFunc("POST /control/rest/tokens", func(w http.ResponseWriter, req *http.Request) {
		var t APIToken
		if err := decodeJSON(req, &t); err != nil || t.Token == "" {
			writeError(w, http.StatusBadRequest, "give a token: {\"token\": ..., \"scopes\": [...], \"organizations\": [...]} (%v)", err)
			return
		}
		r.AddToken(t)
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("POST /control/rest/clusters", func(w http.ResponseWriter, req *http.Request) {
		var c struct {
			Organization string `json:"organization"`
			Name         string `json:"name"`
		}
		if err := decodeJSON(req, &c); err != nil || c.Organization == "" || c.Name == "" {
			writeError(w, http.StatusBadRequest, "give {\"organization\": ..., \"name\": ...} (%v)", err)
			return
		}
		writeJSON(w, http.StatusCreated, map[string]string{"id": r.AddCluster(c.Organization, c.Name)})
	})
	mux.HandleFunc("POST /control/rest/queues", func(w http.ResponseWriter, req *http.Request) {
		var q queueRef
		if err := decodeJSON(req, &q); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		id, err := r.AddQueue(q.Organization, q.Cluster, q.Key)
		if err != nil {
			writeError(w, http.StatusUnprocessableEntity, "%v", err)
			return
		}
		writeJSON(w, http.StatusCreated, map[string]string{"id": id})
	})
	mux.HandleFunc("POST /control/rest/pipeline_clusters", func(w http.ResponseWriter, req *http.Request) {
		var pc struct {
			Organization string `json:"organization"`
			Pipeline     string `json:"pipeline"`
			Cluster      string `json:"cluster"` // name or UUID
		}
		if err := decodeJSON(req, &pc); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		if err := r.SetPipelineCluster(pc.Organization, pc.Pipeline, pc.Cluster); err != nil {
			writeError(w, http.StatusUnprocessableEntity, "%v", err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /control/rest/rate_limit", func(w http.ResponseWriter, req *http.Request) {
		var rl struct {
			Limit  int    `json:"limit"`
			Window string `json:"window"` // a Go duration, such as "1m"; a minute when empty
		}
		if err := decodeJSON(req, &rl); err != nil {
			writeError(w, http.StatusBadRequest, "%v", err)
			return
		}
		var window time.Duration
		if rl.Window != "" {
			d, err := time.ParseDuration(rl.Window)
			if err != nil || d <= 0 {
				writeError(w, http.StatusBadRequest, "window %q: give a duration such as \"1m\"", rl.Window)
				return
			}
			window = d
		}
		r.SetRateLimit(rl.Limit, window)
		w.WriteHeader(http.StatusNoContent)
	})
	for _, action := range []string{"pause", "resume"} {
		mux.HandleFunc("POST /control/rest/queues/"+action, func(w http.ResponseWriter, req *http.Request) {
			var q queueRef
			if err := decodeJSON(req, &q); err != nil {
				writeError(w, http.StatusBadRequest, "%v", err)
				return
			}
			err := r.ResumeQueue(q.Organization, q.Cluster, q.Key)
			if action == "pause" {
				err = r.PauseQueue(q.Organization, q.Cluster, q.Key, q.Note)
			}
			if err != nil {
				writeError(w, http.StatusUnprocessableEntity, "%v", err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})
	}
}
