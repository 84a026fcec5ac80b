package fakebuildkite

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/buildkite/go-buildkite/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildOf makes a build of pipeline in org "acme" from yaml.
func buildOf(t *testing.T, s *Server, pipeline, yaml string) *Build {
	t.Helper()
	b, err := s.CreateBuild(BuildRequest{Org: "acme", Pipeline: pipeline, PipelineYAML: yaml})
	require.NoError(t, err)
	return b
}

// jobsByID indexes the jobs of builds.
func jobsByID(builds []buildkite.Build) map[string]buildkite.Job {
	out := map[string]buildkite.Job{}
	for _, b := range builds {
		for _, j := range b.Jobs {
			out[j.ID] = j
		}
	}
	return out
}

// The builds listings show the fake's own builds and jobs as go-buildkite reads them: the
// REST API's job states, agent query rules, the agent of a job taken, state filters, the
// newest build first, with read_builds.
func TestRESTBuilds(t *testing.T) {
	s := StartForTest(t, Options{})
	rest := s.REST()
	rest.AddOrganization("acme")
	rest.AddToken(APIToken{Token: "builds", Scopes: []string{ScopeReadBuilds}, Organizations: []string{"acme"}})
	rest.AddToken(APIToken{Token: "clusters-only", Scopes: []string{ScopeReadClusters}, Organizations: []string{"acme"}})

	// Three jobs on bk-operator, one elsewhere; an agent takes one, starts it and passes it.
	done := buildOf(t, s, "app", "steps:\n  - command: make done\n    agents: {queue: bk-operator}\n")
	taken := s.AcceptJobForTest(t, "agent-1", "queue=bk-operator")
	require.Equal(t, done.Jobs[0], taken.ID)
	s.callForTest(t, http.MethodPut, "/jobs/"+taken.ID+"/start", taken.Token, map[string]string{}, nil)
	s.callForTest(t, http.MethodPut, "/jobs/"+taken.ID+"/finish", taken.Token, map[string]string{"exit_status": "0"}, nil)
	running := buildOf(t, s, "app", "steps:\n  - command: make a\n    agents: {queue: bk-operator}\n  - command: make b\n    agents: {queue: bk-operator, cluster: gke-prod}\n")
	busy := s.AcceptJobForTest(t, "agent-2", "queue=bk-operator")
	require.Equal(t, running.Jobs[0], busy.ID)
	s.callForTest(t, http.MethodPut, "/jobs/"+busy.ID+"/start", busy.Token, map[string]string{}, nil)
	waiting := buildOf(t, s, "other", "steps:\n  - command: make c\n    parallelism: 2\n    agents: {queue: bk-operator}\n  - command: make d\n")

	ctx := context.Background()
	bk := restClient(t, s, "builds")
	all, resp, err := bk.Builds.ListByOrg(ctx, "acme", nil)
	require.NoError(t, err)
	require.Len(t, all, 3)
	assert.Equal(t, []int{1, 2, 1}, []int{all[0].Number, all[1].Number, all[2].Number}, "newest first: other#1, app#2, app#1")
	assert.Equal(t, []string{"scheduled", "running", "passed"}, []string{all[0].State, all[1].State, all[2].State})
	assert.Equal(t, "200", resp.Header.Get("RateLimit-Limit"), "Buildkite's limit, said in every answer")
	assert.NotEmpty(t, resp.Header.Get("RateLimit-Remaining"))

	jobs := jobsByID(all)
	assert.Equal(t, "passed", jobs[done.Jobs[0]].State, "a finished job is passed or failed in the REST API")
	require.NotNil(t, jobs[done.Jobs[0]].ExitStatus)
	assert.Equal(t, 0, *jobs[done.Jobs[0]].ExitStatus)
	assert.NotNil(t, jobs[done.Jobs[0]].FinishedAt)
	assert.Equal(t, "running", jobs[running.Jobs[0]].State)
	assert.Equal(t, "agent-2", jobs[running.Jobs[0]].Agent.Name)
	assert.Equal(t, "scheduled", jobs[running.Jobs[1]].State)
	assert.Equal(t, []string{"cluster=gke-prod", "queue=bk-operator"}, jobs[running.Jobs[1]].AgentQueryRules)
	assert.Nil(t, jobs[running.Jobs[1]].ExitStatus)
	assert.Nil(t, jobs[running.Jobs[1]].StartedAt)
	assert.Equal(t, "scheduled", jobs[waiting.Jobs[1]].State)
	require.NotNil(t, jobs[waiting.Jobs[1]].ParallelGroupIndex)
	assert.Equal(t, 1, *jobs[waiting.Jobs[1]].ParallelGroupIndex)
	assert.Equal(t, []string{"queue=default"}, jobs[waiting.Jobs[2]].AgentQueryRules, "a job without a queue targets the default queue")
	assert.Empty(t, jobs[waiting.Jobs[2]].ClusterID, "a pipeline in no cluster")
	require.NotNil(t, all[0].Pipeline)
	assert.Equal(t, "other", all[0].Pipeline.Slug)

	// State filters, as go-buildkite sends them (state[]=...), and Buildkite's "finished".
	for _, tc := range []struct {
		states []string
		want   []string
	}{
		{[]string{"scheduled", "running"}, []string{waiting.ID, running.ID}},
		{[]string{"running"}, []string{running.ID}},
		{[]string{"finished"}, []string{done.ID}},
		{[]string{"canceled"}, nil},
	} {
		got, _, err := bk.Builds.ListByOrg(ctx, "acme", &buildkite.BuildsListOptions{State: tc.states, ExcludePipeline: true})
		require.NoError(t, err)
		var ids []string
		for _, b := range got {
			ids = append(ids, b.ID)
			assert.Nil(t, b.Pipeline, "exclude_pipeline")
		}
		assert.Equal(t, tc.want, ids, "state %v", tc.states)
	}
	// A pipeline's builds, without their jobs; and a page of one, linked to the next.
	got, _, err := bk.Builds.ListByPipeline(ctx, "acme", "app", &buildkite.BuildsListOptions{ExcludeJobs: true})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Empty(t, got[0].Jobs)
	got, resp, err = bk.Builds.ListByOrg(ctx, "acme", &buildkite.BuildsListOptions{ListOptions: buildkite.ListOptions{PerPage: 1}})
	require.NoError(t, err)
	assert.Len(t, got, 1)
	assert.Equal(t, 2, resp.NextPage)

	// read_builds it takes, and an organization the token was granted.
	_, _, err = restClient(t, s, "clusters-only").Builds.ListByOrg(ctx, "acme", nil)
	status, msg := restStatus(err)
	assert.Equal(t, http.StatusForbidden, status)
	assert.Equal(t, "Your access token doesn't have the read_builds scope", msg)
	rest.AddOrganization("globex")
	_, _, err = bk.Builds.ListByOrg(ctx, "globex", nil)
	status, _ = restStatus(err)
	assert.Equal(t, http.StatusNotFound, status)
	assert.Positive(t, s.RequestCount(EPRESTBuilds, ""))
}

// A job of a pipeline in a cluster names the cluster and the cluster's queue its queue
// rule targets.
func TestRESTBuildsInACluster(t *testing.T) {
	s := StartForTest(t, Options{})
	rest := s.REST()
	rest.AddToken(APIToken{Token: "builds", Scopes: []string{ScopeReadBuilds}, Organizations: []string{"acme"}})
	gke := rest.AddCluster("acme", "gke-prod")
	qid, err := rest.AddQueue("acme", "gke-prod", "bk-operator")
	require.NoError(t, err)
	require.Error(t, rest.SetPipelineCluster("acme", "app", "no-such-cluster"))
	require.NoError(t, rest.SetPipelineCluster("acme", "app", "gke-prod"))
	b := buildOf(t, s, "app", "steps:\n  - command: a\n    agents: {queue: bk-operator}\n  - command: b\n    agents: {queue: elsewhere}\n")
	other := buildOf(t, s, "unclustered", "steps:\n  - command: c\n    agents: {queue: bk-operator}\n")

	builds, _, err := restClient(t, s, "builds").Builds.ListByOrg(context.Background(), "acme", nil)
	require.NoError(t, err)
	jobs := jobsByID(builds)
	assert.Equal(t, gke, jobs[b.Jobs[0]].ClusterID)
	assert.Equal(t, qid, jobs[b.Jobs[0]].ClusterQueueID)
	assert.Equal(t, gke, jobs[b.Jobs[1]].ClusterID)
	assert.Empty(t, jobs[b.Jobs[1]].ClusterQueueID, "the cluster has no such queue")
	assert.Empty(t, jobs[other.Jobs[0]].ClusterID)
	assert.Empty(t, jobs[other.Jobs[0]].ClusterQueueID)
}

// The REST API's rate limit: RateLimit-* headers in every answer, 429 beyond the limit
// until the window ends.
func TestRESTRateLimit(t *testing.T) {
	s := StartForTest(t, Options{})
	s.REST().AddToken(APIToken{Token: "builds", Scopes: []string{ScopeReadBuilds}, Organizations: []string{"acme"}})
	s.REST().AddOrganization("acme")
	s.REST().SetRateLimit(2, 400*time.Millisecond)
	get := func() (int, http.Header) {
		req, err := http.NewRequest(http.MethodGet, s.RESTEndpoint()+"v2/organizations/acme/builds", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer builds")
		resp, err := testClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	for i, want := range []struct {
		status    int
		remaining string
	}{{200, "1"}, {200, "0"}, {429, "0"}} {
		status, h := get()
		assert.Equal(t, want.status, status, "call %d", i)
		assert.Equal(t, "2", h.Get("RateLimit-Limit"))
		assert.Equal(t, want.remaining, h.Get("RateLimit-Remaining"), "call %d", i)
		reset, err := strconv.Atoi(h.Get("RateLimit-Reset"))
		require.NoError(t, err)
		assert.Equal(t, 1, reset, "seconds, rounded up")
	}
	time.Sleep(450 * time.Millisecond)
	status, h := get()
	assert.Equal(t, http.StatusOK, status, "a new window")
	assert.Equal(t, "1", h.Get("RateLimit-Remaining"))

	// The control API sets it too.
	resp, err := testClient.Post(s.URL()+"/control/rest/rate_limit", "application/json", strings.NewReader(`{"limit": 1, "window": "1m"}`))
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	status, _ = get()
	assert.Equal(t, http.StatusOK, status)
	status, h = get()
	assert.Equal(t, http.StatusTooManyRequests, status)
	reset, _ := strconv.Atoi(h.Get("RateLimit-Reset"))
	assert.InDelta(t, 60, reset, 2)
}

// The control API places a pipeline in a cluster.
func TestRESTControlPipelineCluster(t *testing.T) {
	s := StartForTest(t, Options{})
	s.REST().AddToken(APIToken{Token: "builds", Scopes: []string{ScopeReadBuilds}, Organizations: []string{"acme"}})
	s.REST().AddCluster("acme", "gke-prod")
	post := func(body string) int {
		resp, err := testClient.Post(s.URL()+"/control/rest/pipeline_clusters", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusUnprocessableEntity, post(`{"organization":"acme","pipeline":"app","cluster":"eks"}`))
	assert.Equal(t, http.StatusNoContent, post(`{"organization":"acme","pipeline":"app","cluster":"gke-prod"}`))
	b := buildOf(t, s, "app", "steps:\n  - command: a\n")
	builds, _, err := restClient(t, s, "builds").Builds.ListByOrg(context.Background(), "acme", nil)
	require.NoError(t, err)
	assert.NotEmpty(t, jobsByID(builds)[b.Jobs[0]].ClusterID)
}

// A running build one of whose jobs failed is failing in the REST API, as on Buildkite.
func TestRESTBuildsFailing(t *testing.T) {
	s := StartForTest(t, Options{})
	s.REST().AddToken(APIToken{Token: "builds", Scopes: []string{ScopeReadBuilds}, Organizations: []string{"acme"}})
	s.REST().AddOrganization("acme")
	b := buildOf(t, s, "app", "steps:\n  - command: a\n    agents: {queue: q}\n  - command: b\n    agents: {queue: q}\n")
	taken := s.AcceptJobForTest(t, "agent-1", "queue=q")
	s.callForTest(t, http.MethodPut, "/jobs/"+taken.ID+"/start", taken.Token, map[string]string{}, nil)
	s.callForTest(t, http.MethodPut, "/jobs/"+taken.ID+"/finish", taken.Token, map[string]string{"exit_status": "2"}, nil)
	snap, _ := s.Build(b.ID)
	assert.Equal(t, "running", snap.State, "the agent API's view is unchanged")

	bk := restClient(t, s, "builds")
	got, _, err := bk.Builds.ListByOrg(context.Background(), "acme", &buildkite.BuildsListOptions{State: []string{"failing"}})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "failing", got[0].State)
	jobs := jobsByID(got)
	assert.Equal(t, "failed", jobs[taken.ID].State)
	require.NotNil(t, jobs[taken.ID].ExitStatus)
	assert.Equal(t, 2, *jobs[taken.ID].ExitStatus)
	assert.Equal(t, "scheduled", jobs[b.Jobs[1]].State)
	got, _, err = bk.Builds.ListByOrg(context.Background(), "acme", &buildkite.BuildsListOptions{State: []string{"running"}})
	require.NoError(t, err)
	assert.Empty(t, got)
}
