package preflight

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/buildkite/go-buildkite/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// Lookup against the fake: what it finds, the calls it makes for it (no cluster read
// without a cluster), and what it reports, in the start-up check's words.
func TestLookup(t *testing.T) {
	readBuilds := Need{Scope: "read_builds", For: "lists the builds"}
	all := []string{"read_builds", ScopeReadClusters, ScopeReadOrganizations}
	cases := []struct {
		name   string
		scopes []string
		token  string
		cfg    Config
		setup  func(t *testing.T, fake *fakebuildkite.Server)
		// queue: the lookup finds the queue of cluster eks (made by the test).
		queue bool
		calls []string
		// reason is the LookupError's finding's; status the APIError's.
		reason   string
		status   int
		contains []string
	}{
		{
			name: "the cluster's queue", scopes: all, cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"}, queue: true,
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTQueues},
		},
		{
			name: "the organization found, then the queue", scopes: all, cfg: Config{Cluster: "EKS", Queue: "bk-operator"}, queue: true,
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTOrganizations, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTQueues},
		},
		{
			name: "a paused queue is found: the caller judges it", scopes: all, cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"}, queue: true,
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				require.NoError(t, fake.REST().PauseQueue("acme", "eks", "bk-operator", ""))
			},
		},
		{
			name: "no cluster: no cluster read", scopes: []string{"read_builds"}, cfg: Config{Organization: "acme", Queue: "bk-operator"},
			calls: []string{fakebuildkite.EPRESTAccessToken},
		},
		{
			name: "the caller's scope missing", scopes: []string{ScopeReadClusters}, cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"},
			reason: ReasonTokenScope,
			contains: []string{`the Buildkite API token lacks the read_builds scope: read_builds lists the builds, read_clusters finds queue "bk-operator" in cluster "eks". ` +
				"Add it to the token in Buildkite (Personal Settings > API Access Tokens), or give a token that has it"},
			calls: []string{fakebuildkite.EPRESTAccessToken},
		},
		{
			name: "the lookup's scopes missing", scopes: []string{"read_builds"}, cfg: Config{Cluster: "eks", Queue: "bk-operator"},
			reason:   ReasonTokenScope,
			contains: []string{"lacks the read_clusters and read_organizations scopes: read_builds lists the builds, ", "read_organizations finds the organization (give --buildkite-organization to need it no more). Add them"},
		},
		{
			name: "no such cluster", scopes: all, cfg: Config{Organization: "acme", Cluster: "aks", Queue: "bk-operator"},
			reason: ReasonClusterNotFound, contains: []string{`Buildkite organization acme has no cluster named "aks" or of that UUID (it has "gke-prod", "other", "eks")`},
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTClusters},
		},
		{
			name: "no such queue", scopes: all, cfg: Config{Organization: "acme", Cluster: "other", Queue: "bk-operator"},
			reason: ReasonQueueNotFound, contains: []string{`cluster "other" (`, `has no queue "bk-operator"`, "or --buildkite-cluster if agentd's agent token is of another cluster"},
		},
		{
			name: "a token Buildkite does not know", scopes: all, token: "bkua_not-a-token", cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"},
			status: http.StatusUnauthorized, contains: []string{"GET v2/access-token: 401 Authentication required"},
		},
		{
			name: "an organization the token was not granted", scopes: all, cfg: Config{Organization: "globex", Cluster: "eks", Queue: "bk-operator"},
			status: http.StatusNotFound, contains: []string{"GET v2/organizations/globex/clusters: 404 No organization found"},
		},
		{
			name: "the queues unreadable", scopes: all, cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"},
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTQueues, Status: http.StatusBadGateway, Message: "upstream down"})
			},
			status: http.StatusBadGateway, contains: []string{"/queues: 502 upstream down"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake, _ := fakeOrg(t, tc.scopes...)
			fake.REST().AddCluster("acme", "eks")
			eksQueue, err := fake.REST().AddQueue("acme", "eks", "bk-operator")
			require.NoError(t, err)
			if tc.setup != nil {
				tc.setup(t, fake)
			}
			token := testToken
			if tc.token != "" {
				token = tc.token
			}
			bk, err := NewClient(fake.RESTEndpoint(), token, "", http.DefaultClient)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			found, err := Lookup(ctx, bk, tc.cfg, readBuilds)

			var le *LookupError
			var ae *APIError
			switch {
			case tc.reason != "":
				require.ErrorAs(t, err, &le)
				assert.Equal(t, tc.reason, le.Finding.Reason)
				assert.True(t, le.Finding.Problem)
				assert.Equal(t, le.Finding.Message, err.Error())
			case tc.status != 0:
				require.ErrorAs(t, err, &ae)
				assert.Equal(t, tc.status, ae.Status)
				assert.Equal(t, tc.status, StatusOf(err))
				assert.False(t, errors.As(err, &le), "a call that failed is not a finding")
			default:
				require.NoError(t, err)
				assert.Equal(t, "acme", found.Organization)
			}
			for _, s := range tc.contains {
				assert.Contains(t, err.Error(), s)
			}
			if err != nil {
				assert.NotContains(t, err.Error(), token)
			}
			if tc.queue {
				assert.Equal(t, "eks", found.Cluster.Name)
				assert.Equal(t, eksQueue, found.Queue.ID, "the queue of the configured cluster, not the one of the same key in gke-prod")
				assert.Equal(t, "bk-operator", found.Queue.Key)
				assert.Equal(t, tc.setup != nil, found.Queue.DispatchPaused)
			} else if err == nil {
				assert.Equal(t, Found{Organization: "acme"}, found, "no cluster, no queue")
			}
			if tc.calls != nil {
				assert.Equal(t, tc.calls, endpoints(fake))
			}
		})
	}
}

// Needs: the caller's scopes first, then the lookup's own, each once.
func TestNeeds(t *testing.T) {
	own := Need{Scope: "read_builds", For: "lists the builds"}
	for _, tc := range []struct {
		name string
		cfg  Config
		own  []Need
		want []string
	}{
		{"organization and cluster", Config{Organization: "acme", Cluster: "eks"}, []Need{own}, []string{"read_builds", ScopeReadClusters}},
		{"organization only", Config{Organization: "acme"}, []Need{own}, []string{"read_builds"}},
		{"nothing configured", Config{}, []Need{own}, []string{"read_builds", ScopeReadOrganizations}},
		{"the caller's own read_clusters is kept", Config{Cluster: "eks"}, []Need{{Scope: ScopeReadClusters, For: "x"}}, []string{ScopeReadClusters, ScopeReadOrganizations}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needs := Needs(tc.cfg, tc.own...)
			assert.Equal(t, tc.want, Scopes(needs))
			assert.Equal(t, tc.own[0], needs[0])
		})
	}
}

// Paginate reads up to maxPages, and says whether pages were left.
func TestPaginate(t *testing.T) {
	for _, tc := range []struct {
		name            string
		pages, maxPages int
		// selfNext: the last page names itself as the next.
		selfNext  bool
		wantCalls int
		wantMore  bool
	}{
		{"all of three", 3, 5, false, 3, false},
		{"exactly the bound", 3, 3, false, 3, false},
		{"cut at the bound", 5, 3, false, 3, true},
		{"a last page that names itself", 2, 5, true, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []buildkite.ListOptions
			more, err := Paginate(context.Background(), 0, tc.maxPages, func(o buildkite.ListOptions) (*buildkite.Response, error) {
				got = append(got, o)
				resp := &buildkite.Response{}
				switch {
				case o.Page < tc.pages:
					resp.NextPage = o.Page + 1
				case tc.selfNext:
					resp.NextPage = o.Page
				}
				return resp, nil
			})
			require.NoError(t, err)
			assert.Equal(t, tc.wantMore, more)
			require.Len(t, got, tc.wantCalls)
			for i, o := range got {
				assert.Equal(t, buildkite.ListOptions{Page: i + 1, PerPage: MaxPageSize}, o)
			}
		})
	}

	boom := errors.New("boom")
	calls := 0
	more, err := Paginate(context.Background(), 2, 5, func(o buildkite.ListOptions) (*buildkite.Response, error) {
		calls++
		assert.Equal(t, 2, o.PerPage)
		if o.Page == 2 {
			return nil, boom
		}
		return &buildkite.Response{NextPage: o.Page + 1}, nil
	})
	assert.ErrorIs(t, err, boom)
	assert.False(t, more)
	assert.Equal(t, 2, calls, "stops at the error")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = Paginate(ctx, 0, 5, func(buildkite.ListOptions) (*buildkite.Response, error) {
		t.Fatal("called after the context ended")
		return nil, nil
	})
	assert.ErrorIs(t, err, context.Canceled)
}
