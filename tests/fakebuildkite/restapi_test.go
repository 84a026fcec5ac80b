package fakebuildkite

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/buildkite/go-buildkite/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// restClient is go-buildkite, Buildkite's own REST client, against the fake with token.
func restClient(t *testing.T, s *Server, token string) *buildkite.Client {
	t.Helper()
	c, err := buildkite.NewClient(buildkite.WithBaseURL(s.RESTEndpoint()), buildkite.WithTokenAuth(token),
		buildkite.WithHTTPClient(testClient))
	require.NoError(t, err)
	return c
}

// restStatus is the status of the REST answer behind err; 0 when there was none.
func restStatus(err error) (int, string) {
	var er *buildkite.ErrorResponse
	if errors.As(err, &er) {
		return er.Response.StatusCode, er.Message
	}
	return 0, ""
}

// The REST API answers what go-buildkite asks, as Buildkite's documentation says it does:
// the token's scopes, organizations, clusters and queues with dispatch_paused.
func TestRESTAPI(t *testing.T) {
	s := StartForTest(t, Options{})
	rest := s.REST()
	rest.AddToken(APIToken{Token: "reader", Scopes: []string{ScopeReadClusters, ScopeReadOrganizations}, Organizations: []string{"acme"}, UserName: "Sam Kim"})
	rest.AddToken(APIToken{Token: "builds-only", Scopes: []string{"read_builds"}, Organizations: []string{"acme"}})
	rest.AddToken(APIToken{Token: "writer", Scopes: []string{ScopeReadClusters, ScopeWriteClusters}, Organizations: []string{"acme"}, UserName: "Pat Lee"})
	rest.AddOrganization("globex") // no token reaches it
	gke := rest.AddCluster("acme", "gke-prod")
	qid, err := rest.AddQueue("acme", "gke-prod", "bk-operator")
	require.NoError(t, err)
	_, err = rest.AddQueue("acme", gke, "bk-operator")
	require.Error(t, err, "a queue key is unique in its cluster")
	_, err = rest.AddQueue("acme", "eks", "bk-operator")
	require.Error(t, err, "no such cluster")

	ctx := context.Background()
	reader := restClient(t, s, "reader")

	tok, _, err := reader.AccessTokens.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{ScopeReadClusters, ScopeReadOrganizations}, tok.Scopes)
	assert.NotEmpty(t, tok.UUID)
	assert.Equal(t, "Sam Kim", tok.User.Name)

	orgs, _, err := reader.Organizations.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, orgs, 1, "only the organizations the token was granted")
	assert.Equal(t, "acme", orgs[0].Slug)

	clusters, _, err := reader.Clusters.List(ctx, "acme", nil)
	require.NoError(t, err)
	require.Len(t, clusters, 1)
	assert.Equal(t, gke, clusters[0].ID)
	assert.Equal(t, "gke-prod", clusters[0].Name)
	assert.Equal(t, qid, clusters[0].DefaultQueueID)
	assert.Equal(t, s.URL()+"/organizations/acme/clusters/"+gke, clusters[0].WebURL)
	c, _, err := reader.Clusters.Get(ctx, "acme", gke)
	require.NoError(t, err)
	assert.Equal(t, "gke-prod", c.Name)

	queues, _, err := reader.ClusterQueues.List(ctx, "acme", gke, nil)
	require.NoError(t, err)
	require.Len(t, queues, 1)
	assert.Equal(t, "bk-operator", queues[0].Key)
	assert.False(t, queues[0].DispatchPaused)
	assert.Nil(t, queues[0].DispatchPausedAt)

	require.NoError(t, rest.PauseQueue("acme", "gke-prod", "bk-operator", "node upgrade"))
	q, _, err := reader.ClusterQueues.Get(ctx, "acme", gke, qid)
	require.NoError(t, err)
	assert.True(t, q.DispatchPaused)
	assert.Equal(t, "node upgrade", q.DispatchPausedNote)
	require.NotNil(t, q.DispatchPausedBy)
	assert.Equal(t, "Fake User", q.DispatchPausedBy.Name)
	require.NotNil(t, q.DispatchPausedAt)
	assert.WithinDuration(t, time.Now(), q.DispatchPausedAt.Time, time.Minute)

	// Resuming and pausing through the REST API takes write_clusters.
	_, err = reader.ClusterQueues.Resume(ctx, "acme", gke, qid)
	status, msg := restStatus(err)
	assert.Equal(t, http.StatusForbidden, status)
	assert.Equal(t, "Your access token doesn't have the write_clusters scope", msg)
	writer := restClient(t, s, "writer")
	_, err = writer.ClusterQueues.Resume(ctx, "acme", gke, qid)
	require.NoError(t, err)
	q, _, err = reader.ClusterQueues.Get(ctx, "acme", gke, qid)
	require.NoError(t, err)
	assert.False(t, q.DispatchPaused)
	q, _, err = writer.ClusterQueues.Pause(ctx, "acme", gke, qid, buildkite.ClusterQueuePause{Note: "by API"})
	require.NoError(t, err)
	assert.True(t, q.DispatchPaused)
	assert.Equal(t, "by API", q.DispatchPausedNote)
	assert.Equal(t, "Pat Lee", q.DispatchPausedBy.Name, "paused by the token's user")

	// Buildkite's refusals.
	refusals := []struct {
		name    string
		call    func() error
		status  int
		message string
	}{
		{"an unknown token", func() error { _, _, err := restClient(t, s, "nope").AccessTokens.Get(ctx); return err },
			401, "Authentication required. Please supply a valid API Access Token: https://buildkite.com/docs/apis/rest-api#authentication"},
		{"no token", func() error { _, _, err := restClient(t, s, "").Clusters.List(ctx, "acme", nil); return err },
			401, "Authentication required. Please supply a valid API Access Token: https://buildkite.com/docs/apis/rest-api#authentication"},
		{"a scope missing", func() error { _, _, err := restClient(t, s, "builds-only").Clusters.List(ctx, "acme", nil); return err },
			403, "Your access token doesn't have the read_clusters scope"},
		{"read_organizations missing", func() error { _, _, err := writer.Organizations.List(ctx, nil); return err },
			403, "Your access token doesn't have the read_organizations scope"},
		{"an organization not granted", func() error { _, _, err := reader.Clusters.List(ctx, "globex", nil); return err },
			404, "No organization found"},
		{"an organization that does not exist", func() error { _, _, err := reader.Organizations.Get(ctx, "initech"); return err },
			404, "No organization found"},
		{"a cluster that does not exist", func() error { _, _, err := reader.ClusterQueues.List(ctx, "acme", "no-such-cluster", nil); return err },
			404, "No cluster found"},
		{"a queue that does not exist", func() error { _, _, err := reader.ClusterQueues.Get(ctx, "acme", gke, "no-such-queue"); return err },
			404, "No queue found"},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			status, msg := restStatus(r.call())
			assert.Equal(t, r.status, status)
			assert.Equal(t, r.message, msg)
		})
	}

	// Every call was recorded under its endpoint name, and faults apply to them.
	s.Inject(Fault{Endpoint: EPRESTAccessToken, Status: 503, Times: 1})
	_, _, err = reader.AccessTokens.Get(ctx)
	status, _ = restStatus(err)
	assert.Equal(t, 503, status)
	assert.Positive(t, s.RequestCount(EPRESTQueues, ""))
	assert.Positive(t, s.RequestCount(EPRESTClusters, ""))
}

// Listings are paged with page and per_page and a Link header, which go-buildkite follows.
func TestRESTAPIPages(t *testing.T) {
	s := StartForTest(t, Options{})
	s.REST().AddToken(APIToken{Token: "reader", Scopes: []string{ScopeReadClusters}, Organizations: []string{"acme"}})
	var want []string
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		s.REST().AddCluster("acme", name)
		want = append(want, name)
	}
	bk := restClient(t, s, "reader")
	var got []string
	opt := &buildkite.ClustersListOptions{ListOptions: buildkite.ListOptions{Page: 1, PerPage: 2}}
	var lastPages []int
	for {
		cs, resp, err := bk.Clusters.List(context.Background(), "acme", opt)
		require.NoError(t, err)
		for _, c := range cs {
			got = append(got, c.Name)
		}
		lastPages = append(lastPages, resp.LastPage)
		if resp.NextPage == 0 {
			break
		}
		opt.Page = resp.NextPage
	}
	assert.Equal(t, want, got)
	assert.Equal(t, []int{3, 3, 0}, lastPages, "no last link on the last page")

	// The default page is 30, and a page beyond the last is empty, not an error.
	cs, _, err := bk.Clusters.List(context.Background(), "acme", nil)
	require.NoError(t, err)
	assert.Len(t, cs, 5)
	cs, _, err = bk.Clusters.List(context.Background(), "acme", &buildkite.ClustersListOptions{ListOptions: buildkite.ListOptions{Page: 9}})
	require.NoError(t, err)
	assert.Empty(t, cs)
}

// The control API makes what REST()'s methods make, for a fake run as a program.
func TestRESTControlAPI(t *testing.T) {
	s := StartForTest(t, Options{})
	post := func(path, body string) (int, string) {
		resp, err := testClient.Post(s.URL()+"/control/rest/"+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	status, body := post("tokens", `{"token":"t1","scopes":["read_clusters"],"organizations":["acme"]}`)
	require.Equal(t, http.StatusCreated, status, body)
	status, body = post("clusters", `{"organization":"acme","name":"gke-prod"}`)
	require.Equal(t, http.StatusCreated, status, body)
	var cluster struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(body), &cluster))
	status, body = post("queues", `{"organization":"acme","cluster":"gke-prod","key":"bk-operator"}`)
	require.Equal(t, http.StatusCreated, status, body)
	status, body = post("queues/pause", `{"organization":"acme","cluster":"`+cluster.ID+`","key":"bk-operator","note":"why"}`)
	require.Equal(t, http.StatusNoContent, status, body)

	qs, _, err := restClient(t, s, "t1").ClusterQueues.List(context.Background(), "acme", cluster.ID, nil)
	require.NoError(t, err)
	require.Len(t, qs, 1)
	assert.True(t, qs[0].DispatchPaused)
	assert.Equal(t, "why", qs[0].DispatchPausedNote)

	status, body = post("queues/resume", `{"organization":"acme","cluster":"gke-prod","key":"bk-operator"}`)
	require.Equal(t, http.StatusNoContent, status, body)
	qs, _, err = restClient(t, s, "t1").ClusterQueues.List(context.Background(), "acme", cluster.ID, nil)
	require.NoError(t, err)
	assert.False(t, qs[0].DispatchPaused)

	status, _ = post("queues/pause", `{"organization":"acme","cluster":"gke-prod","key":"nope"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, status)
	status, _ = post("tokens", `{}`)
	assert.Equal(t, http.StatusBadRequest, status)

	// An unknown REST path is a JSON 404, as Buildkite's.
	resp, err := testClient.Get(s.URL() + "/v2/nothing-here")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "application/json")
}
