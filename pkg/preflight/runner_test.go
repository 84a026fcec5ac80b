package preflight

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

const testToken = "bkua_preflight-test-token-0123456789"

// fakeOrg is a fake Buildkite with organization acme: cluster gke-prod with queues default
// and bk-operator, and cluster other with queue default; and testToken, with scopes.
func fakeOrg(t *testing.T, scopes ...string) (*fakebuildkite.Server, string) {
	t.Helper()
	fake := fakebuildkite.StartForTest(t, fakebuildkite.Options{})
	rest := fake.REST()
	rest.AddToken(fakebuildkite.APIToken{Token: testToken, Scopes: scopes, Organizations: []string{"acme"}})
	gke := rest.AddCluster("acme", "gke-prod")
	rest.AddCluster("acme", "other")
	for _, q := range []struct{ cluster, key string }{{"gke-prod", "default"}, {"gke-prod", "bk-operator"}, {"other", "default"}} {
		_, err := rest.AddQueue("acme", q.cluster, q.key)
		require.NoError(t, err)
	}
	return fake, gke
}

// endpoints are the REST endpoints fake was asked, in order.
func endpoints(fake *fakebuildkite.Server) []string {
	var calls []string
	for _, r := range fake.Requests() {
		calls = append(calls, r.Endpoint)
	}
	return calls
}

func runner(fake *fakebuildkite.Server, token string) *Runner {
	return &Runner{Endpoint: fake.RESTEndpoint(), Token: token, UserAgent: "preflight-test", Timeout: 20 * time.Second, retryWait: time.Millisecond}
}

// The runner against the fake Buildkite: each finding as Buildkite's answers make it, and
// the token in none of them.
func TestRunnerAgainstTheFake(t *testing.T) {
	named := Config{Organization: "acme", Cluster: "gke-prod", Queue: "bk-operator"}
	cases := []struct {
		name   string
		scopes []string
		token  string
		cfg    Config
		// byUUID names the cluster gke-prod by its UUID.
		byUUID bool
		setup  func(t *testing.T, fake *fakebuildkite.Server)
		want   []string
		// contains is what the first finding says.
		contains []string
		// calls are the REST endpoints asked, in order.
		calls []string
	}{
		{
			name: "all good", scopes: []string{ScopeReadClusters}, cfg: named,
			want: []string{ReasonPassed}, contains: []string{`queue "bk-operator" exists in cluster "gke-prod"`},
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTQueues},
		},
		{
			name: "the cluster by UUID", scopes: []string{ScopeReadClusters}, byUUID: true,
			cfg:  Config{Organization: "acme", Queue: "bk-operator"},
			want: []string{ReasonPassed}, contains: []string{`cluster "gke-prod"`},
		},
		{
			name: "cluster missing", scopes: []string{ScopeReadClusters}, cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"},
			want: []string{ReasonClusterNotFound}, contains: []string{`Buildkite organization acme has no cluster named "eks"`, `it has "gke-prod", "other"`},
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTClusters},
		},
		{
			name: "queue missing", scopes: []string{ScopeReadClusters}, cfg: Config{Organization: "acme", Cluster: "other", Queue: "bk-operator"},
			want: []string{ReasonQueueNotFound}, contains: []string{`cluster "other"`, `has no queue "bk-operator"`, "/queues, New Queue"},
		},
		{
			name: "queue paused", scopes: []string{ScopeReadClusters}, cfg: named,
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				require.NoError(t, fake.REST().PauseQueue("acme", "gke-prod", "bk-operator", "node upgrade"))
			},
			want: []string{ReasonQueuePaused}, contains: []string{`dispatch is paused on queue "bk-operator" of cluster "gke-prod"`, `paused by Fake User, at `, `note "node upgrade"`, "resume_dispatch"},
		},
		{
			name: "queue paused, then resumed", scopes: []string{ScopeReadClusters}, cfg: named,
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				require.NoError(t, fake.REST().PauseQueue("acme", "gke-prod", "bk-operator", ""))
				require.NoError(t, fake.REST().ResumeQueue("acme", "gke-prod", "bk-operator"))
			},
			want: []string{ReasonPassed},
		},
		{
			name: "bad token", scopes: []string{ScopeReadClusters}, token: "bkua_not-a-token", cfg: named,
			want: []string{ReasonTokenRejected},
			contains: []string{"Buildkite rejected the API token", "401 Authentication required. Please supply a valid API Access Token",
				"with the read_clusters scope and access to organization acme"},
			calls: []string{fakebuildkite.EPRESTAccessToken},
		},
		{
			name: "token without read_clusters", scopes: []string{"read_builds"}, cfg: named,
			want: []string{ReasonTokenScope}, contains: []string{"lacks the read_clusters scope"},
			calls: []string{fakebuildkite.EPRESTAccessToken},
		},
		{
			name: "organization the token was not granted", scopes: []string{ScopeReadClusters}, cfg: Config{Organization: "globex", Cluster: "gke-prod", Queue: "bk-operator"},
			want: []string{ReasonOrganizationNotFound}, contains: []string{`no organization "globex"`, "404 No organization found"},
		},
		{
			name: "the organization found from the token", scopes: []string{ScopeReadClusters, ScopeReadOrganizations}, cfg: Config{Cluster: "gke-prod", Queue: "bk-operator"},
			want: []string{ReasonPassed}, contains: []string{"organization acme"},
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTOrganizations, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTQueues},
		},
		{
			name: "no cluster named: every cluster searched", scopes: []string{ScopeReadClusters}, cfg: Config{Organization: "acme", Queue: "bk-operator"},
			want: []string{ReasonPassed}, contains: []string{`cluster "gke-prod"`, "searching every cluster"},
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTQueues, fakebuildkite.EPRESTQueues},
		},
		{
			name: "a 502 is retried", scopes: []string{ScopeReadClusters}, cfg: named,
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTClusters, Status: 502, Times: 2})
			},
			want:  []string{ReasonPassed},
			calls: []string{fakebuildkite.EPRESTAccessToken, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTClusters, fakebuildkite.EPRESTQueues},
		},
		{
			name: "a 502 that lasts", scopes: []string{ScopeReadClusters}, cfg: named,
			setup: func(t *testing.T, fake *fakebuildkite.Server) {
				fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTQueues, Status: 502, Message: "upstream down"})
			},
			want: []string{ReasonUnavailable}, contains: []string{"list the queues of cluster \"gke-prod\"", "502 upstream down"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake, gke := fakeOrg(t, tc.scopes...)
			cfg := tc.cfg
			if tc.setup != nil {
				tc.setup(t, fake)
			}
			if tc.byUUID {
				cfg.Cluster = gke
			}
			token := testToken
			if tc.token != "" {
				token = tc.token
			}
			got := runner(fake, token).Run(context.Background(), cfg)
			reasons := make([]string, 0, len(got))
			for _, f := range got {
				reasons = append(reasons, f.Reason)
				assert.NotContains(t, f.Message, token, "a finding must never hold the token")
			}
			require.Equal(t, tc.want, reasons, "%+v", got)
			for _, s := range tc.contains {
				assert.Contains(t, got[0].Message, s)
			}
			t.Log(got[0].Message)
			if tc.calls != nil {
				assert.Equal(t, tc.calls, endpoints(fake))
			}
		})
	}
}

// Listings are followed page by page (the fake pages as Buildkite does).
func TestRunnerFollowsPages(t *testing.T) {
	fake, _ := fakeOrg(t, ScopeReadClusters)
	for i := range 5 {
		_, err := fake.REST().AddQueue("acme", "other", fmt.Sprintf("q%d", i))
		require.NoError(t, err)
	}
	_, err := fake.REST().AddQueue("acme", "other", "bk-operator") // the 7th: page 4 of 2
	require.NoError(t, err)
	r := runner(fake, testToken)
	r.pageSize = 2
	a := r.Ask(context.Background(), Config{Organization: "acme", Cluster: "other", Queue: "bk-operator"})
	require.Len(t, a.Clusters, 2)
	require.Len(t, a.Queues[a.Clusters[1].ID], 7)
	got := Evaluate(Config{Organization: "acme", Cluster: "other", Queue: "bk-operator"}, a)
	require.Len(t, got, 1)
	assert.Equal(t, ReasonPassed, got[0].Reason, got[0].Message)
	assert.Equal(t, 1+1+4, len(fake.Requests()), "the token, one page of clusters, four of queues")
}

// A REST API that does not answer is a finding within the timeout, not a hang.
func TestRunnerUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	r := &Runner{Endpoint: "http://" + addr + "/", Token: testToken, Timeout: 5 * time.Second, retryWait: time.Millisecond}
	start := time.Now()
	got := r.Run(context.Background(), Config{Organization: "acme", Cluster: "gke-prod", Queue: "bk-operator"})
	assert.Less(t, time.Since(start), 5*time.Second)
	require.Len(t, got, 1)
	assert.Equal(t, ReasonUnavailable, got[0].Reason)
	assert.Contains(t, got[0].Message, "http://"+addr+"/")
	assert.Contains(t, got[0].Message, "connection refused")

	// One that answers too slowly: the timeout ends the run.
	fake, _ := fakeOrg(t, ScopeReadClusters)
	fake.Inject(fakebuildkite.Fault{Endpoint: fakebuildkite.EPRESTClusters, Latency: time.Minute})
	r = runner(fake, testToken)
	r.Timeout = 500 * time.Millisecond
	start = time.Now()
	got = r.Run(context.Background(), Config{Organization: "acme", Cluster: "gke-prod", Queue: "bk-operator"})
	assert.Less(t, time.Since(start), 5*time.Second)
	require.Len(t, got, 1)
	assert.Equal(t, ReasonUnavailable, got[0].Reason)
	assert.Contains(t, got[0].Message, "context deadline exceeded")
}
