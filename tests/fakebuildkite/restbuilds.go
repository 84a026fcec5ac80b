package fakebuildkite

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The REST API's builds (restapi.go has the rest of the REST API): the fake's own builds and
// jobs, those CreateBuild made and the agent API runs, as Buildkite's "list builds" calls
// show them, with read_builds:
//
//	GET /v2/organizations/{org}/builds
//	GET /v2/organizations/{org}/pipelines/{pipeline}/builds
//
// They take state (state[]=... or state=..., Buildkite's build states, and "finished" for
// passed, failed, blocked and canceled, as Buildkite's documentation says), branch (branch[]=...), exclude_jobs and exclude_pipeline, and page
// as every listing does, newest build first. A job shows its REST API state: a finished
// job is passed or failed by its exit status, as on Buildkite. A job of a pipeline placed
// in a cluster (SetPipelineCluster) carries the cluster's UUID and the UUID of the
// cluster's queue its queue rule names (cluster_id, cluster_queue_id), as jobs of
// clustered pipelines do; other jobs carry neither.

// SetPipelineCluster places pipeline (its slug) of org in cluster (its name or UUID), so
// that the REST API shows its jobs in the cluster's queues. Builds made before or after
// alike show it: the fake keeps no history of the move.
func (r *RESTAPI) SetPipelineCluster(org, pipeline, cluster string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, err := r.clusterLocked(org, cluster)
	if err != nil {
		return err
	}
	if r.pipelineClusters == nil {
		r.pipelineClusters = map[string]string{}
	}
	r.pipelineClusters[org+"/"+pipeline] = c.id
	return nil
}

// clusterOfJobLocked is the cluster and cluster queue a job of pipeline in org with rules
// runs in: none for a pipeline in no cluster; the cluster without a queue when the
// cluster has no queue of the job's queue key.
func (r *RESTAPI) clusterOfJobLocked(org, pipeline string, rules []string) (clusterID, queueID string) {
	clusterID = r.pipelineClusters[org+"/"+pipeline]
	if clusterID == "" {
		return "", ""
	}
	c := r.clusterByIDLocked(org, clusterID)
	if c == nil {
		return clusterID, ""
	}
	key := "default"
	for _, rule := range rules {
		if k, v, _ := strings.Cut(rule, "="); k == "queue" {
			key = v
		}
	}
	for _, q := range c.queues {
		if q.key == key {
			return clusterID, q.id
		}
	}
	return clusterID, ""
}

// buildsQuery is what a builds listing asks for.
type buildsQuery struct {
	org, pipeline   string // pipeline "" for every pipeline of org
	states          []string
	branches        []string
	excludeJobs     bool
	excludePipeline bool
}

func parseBuildsQuery(req *http.Request) buildsQuery {
	q := req.URL.Query()
	values := func(name string) []string {
		var out []string
		for _, v := range append(q[name], q[name+"[]"]...) {
			if v != "" {
				out = append(out, v)
			}
		}
		return out
	}
	truth := func(name string) bool {
		v, _ := strconv.ParseBool(q.Get(name))
		return v
	}
	return buildsQuery{
		org: req.PathValue("org"), pipeline: req.PathValue("pipeline"),
		states: values("state"), branches: values("branch"),
		excludeJobs: truth("exclude_jobs"), excludePipeline: truth("exclude_pipeline"),
	}
}

// buildStateMatches reports whether a build in state is one of states (all when none).
func buildStateMatches(state string, states []string) bool {
	if len(states) == 0 || slices.Contains(states, state) {
		return true
	}
	return slices.Contains(states, "finished") && slices.Contains([]string{"passed", "failed", "blocked", "canceled"}, state)
}

// restBuildStateLocked is b's state as the REST API names it: Buildkite's "failing" for a
// running build one of whose jobs has failed (BuildSnapshot.State says "running").
func (s *Server) restBuildStateLocked(b *build) string {
	state := s.buildStateLocked(b)
	if state != "running" {
		return state
	}
	for _, id := range b.jobs {
		if j := s.jobs[id]; j.state == StateTimedOut || (j.state == StateFinished && j.exitStatus != "0") {
			return "failing"
		}
	}
	return state
}

// restBuildsRoutes serves the builds listings; api is restRoutes' registration helper.
func (s *Server) restBuildsRoutes(api func(pattern, name string, h http.HandlerFunc)) {
	r := s.REST()
	list := func(w http.ResponseWriter, req *http.Request) {
		q := parseBuildsQuery(req)
		r.serve(w, req, ScopeReadBuilds, q.org, func(*restToken) (int, any) {
			// r.mu is held: the lock order is r.mu, then s.mu (restBuildsJSON), never the
			// other way round.
			return http.StatusOK, page(w, req, s.restBuildsJSON(q, r.clusterOfJobLocked))
		})
	}
	api("GET /organizations/{org}/builds", EPRESTBuilds, list)
	api("GET /organizations/{org}/pipelines/{pipeline}/builds", EPRESTBuilds, list)
}

// restBuildsJSON renders the builds q asks for, newest first.
func (s *Server) restBuildsJSON(q buildsQuery, clusterOf func(org, pipeline string, rules []string) (string, string)) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []any{}
	for i := len(s.buildOrder) - 1; i >= 0; i-- {
		b := s.builds[s.buildOrder[i]]
		if b.org != q.org || (q.pipeline != "" && b.pipeline != q.pipeline) {
			continue
		}
		state := s.restBuildStateLocked(b)
		if !buildStateMatches(state, q.states) || (len(q.branches) > 0 && !slices.Contains(q.branches, b.branch)) {
			continue
		}
		out = append(out, s.restBuildJSONLocked(b, state, q, clusterOf))
	}
	return out
}

func (s *Server) restBuildJSONLocked(b *build, state string, q buildsQuery, clusterOf func(org, pipeline string, rules []string) (string, string)) map[string]any {
	api := fmt.Sprintf("%s/v2/organizations/%s/pipelines/%s/builds/%d", s.baseURL, b.org, b.pipeline, b.number)
	var started, finished time.Time
	allDone := true
	for _, id := range b.jobs {
		j := s.jobs[id]
		if !j.startedAt.IsZero() && (started.IsZero() || j.startedAt.Before(started)) {
			started = j.startedAt
		}
		if !IsTerminal(j.state) {
			allDone = false
		} else if j.finishedAt.After(finished) {
			finished = j.finishedAt
		}
	}
	if !allDone {
		finished = time.Time{}
	}
	env := map[string]any{}
	for k, v := range b.env {
		env[k] = v
	}
	out := map[string]any{
		"id": b.id, "graphql_id": "Build---" + b.id, "url": api, "web_url": b.url,
		"number": b.number, "state": state, "blocked": false,
		"message": b.message, "commit": b.commit, "branch": b.branch, "env": env, "source": "api",
		"creator":      map[string]any{"id": "fake-user", "name": "Fake Buildkite", "email": "fake@buildkite.invalid"},
		"created_at":   restTime(b.createdAt),
		"scheduled_at": restTime(b.createdAt),
		"started_at":   restTime(started),
		"finished_at":  restTime(finished),
		"meta_data":    b.metaData,
	}
	if !q.excludePipeline {
		pipeAPI := fmt.Sprintf("%s/v2/organizations/%s/pipelines/%s", s.baseURL, b.org, b.pipeline)
		out["pipeline"] = map[string]any{
			"id": pipelineID(b.org, b.pipeline), "graphql_id": "Pipeline---" + pipelineID(b.org, b.pipeline),
			"slug": b.pipeline, "name": b.pipeline, "repository": b.repo,
			"url": pipeAPI, "web_url": fmt.Sprintf("%s/%s/%s", s.baseURL, b.org, b.pipeline),
			"builds_url": pipeAPI + "/builds", "default_branch": "main",
		}
	}
	if !q.excludeJobs {
		jobs := make([]any, 0, len(b.jobs))
		for _, id := range b.jobs {
			jobs = append(jobs, s.restJobJSONLocked(b, s.jobs[id], clusterOf))
		}
		out["jobs"] = jobs
	}
	return out
}

// restJobJSONLocked is a job as the REST API shows it in its build.
func (s *Server) restJobJSONLocked(b *build, j *job, clusterOf func(org, pipeline string, rules []string) (string, string)) map[string]any {
	label := j.label
	if label == "" {
		label = j.command
	}
	clusterID, queueID := clusterOf(b.org, b.pipeline, j.rules)
	out := map[string]any{
		"id": j.id, "graphql_id": "Job---" + j.id, "type": "script",
		"name": label, "label": label, "step_key": j.stepKey, "command": j.command,
		"state":             restJobState(j),
		"web_url":           b.url + "#" + j.id,
		"agent_query_rules": slices.Clone(j.rules),
		"created_at":        restTime(j.createdAt),
		"scheduled_at":      restTime(j.createdAt),
		"runnable_at":       restTime(j.createdAt),
		"started_at":        restTime(j.startedAt),
		"finished_at":       restTime(j.finishedAt),
		"exit_status":       nil,
		"retried":           false,
		"retries_count":     0,
		"soft_failed":       false,
		"unblockable":       false,
		"priority":          map[string]any{"number": 0},
		"step":              map[string]any{"id": j.stepID},
	}
	if n, err := strconv.Atoi(j.exitStatus); err == nil && IsTerminal(j.state) {
		out["exit_status"] = n
	}
	if j.parallelJob >= 0 {
		out["parallel_group_index"], out["parallel_group_total"] = j.parallelJob, j.parallelCount
	}
	if clusterID != "" {
		out["cluster_id"] = clusterID
	}
	if queueID != "" {
		out["cluster_queue_id"] = queueID
	}
	agentID := j.acceptedBy
	if agentID == "" {
		agentID = j.assignedTo
	}
	if a, ok := s.agents[agentID]; ok {
		out["agent"] = map[string]any{
			"id": a.id, "name": a.name, "hostname": a.hostname, "meta_data": slices.Clone(a.tags),
			"connection_state": s.agentSnapshotLocked(a).State,
		}
	}
	return out
}

// restJobState is a job's state as the REST API names it: the agent API's "finished" is
// passed or failed there, by the exit status.
func restJobState(j *job) string {
	if j.state != StateFinished {
		return j.state
	}
	if j.exitStatus == "0" {
		return "passed"
	}
	return "failed"
}

// restTime is t as the REST API writes times, or null for a time that has not come.
func restTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}
