package preflight

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEvaluate(t *testing.T) {
	const (
		gkeID   = "42f1a7da-812d-4430-93d8-1cc7c33a6bcf"
		otherID = "0188f3ae-7f4e-4a3b-9c2d-5e6f7a8b9c0d"
	)
	gke := Cluster{ID: gkeID, Name: "gke-prod", WebURL: "https://buildkite.com/organizations/acme/clusters/" + gkeID}
	other := Cluster{ID: otherID, Name: "other"}
	both := []string{ScopeReadClusters, ScopeReadOrganizations}
	onlyClusters := []string{ScopeReadClusters}
	queue := Queue{ID: "q-1", Key: "bk-operator"}
	pausedAt := time.Date(2026, 5, 4, 3, 2, 1, 0, time.UTC)
	paused := Queue{ID: "q-1", Key: "bk-operator", DispatchPaused: true, PausedBy: "Sam Kim", PausedAt: pausedAt, PausedNote: "upgrading nodes",
		WebURL: "https://buildkite.com/organizations/acme/clusters/" + gkeID + "/queues/q-1"}
	named := Config{Organization: "acme", Cluster: "gke-prod", Queue: "bk-operator"}
	withQueues := func(qs map[string][]Queue) Answers {
		return Answers{Endpoint: "https://api.buildkite.com/", Token: Token{Scopes: onlyClusters}, Clusters: []Cluster{gke, other}, Queues: qs}
	}

	cases := []struct {
		name string
		cfg  Config
		a    Answers
		// want are the findings' reasons, in order; problem whether the first is one;
		// contains, what its message says.
		want     []string
		problem  bool
		contains []string
		excludes []string
	}{
		{
			name: "all good", cfg: named,
			a:        withQueues(map[string][]Queue{gkeID: {{Key: "other"}, queue}}),
			want:     []string{ReasonPassed},
			contains: []string{`queue "bk-operator" exists in cluster "gke-prod" (` + gkeID + `) of Buildkite organization acme`, "not paused"},
			excludes: []string{"searching every cluster"},
		},
		{
			name: "the cluster by its UUID, in any case", cfg: Config{Organization: "acme", Cluster: "42F1A7DA-812D-4430-93D8-1CC7C33A6BCF", Queue: "bk-operator"},
			a:    withQueues(map[string][]Queue{gkeID: {queue}}),
			want: []string{ReasonPassed},
		},
		{
			name: "the cluster's name in another case", cfg: Config{Organization: "acme", Cluster: "GKE-Prod", Queue: "bk-operator"},
			a:    withQueues(map[string][]Queue{gkeID: {queue}}),
			want: []string{ReasonPassed},
		},
		{
			name: "queue missing", cfg: named,
			a:    withQueues(map[string][]Queue{gkeID: {{Key: "default"}}}),
			want: []string{ReasonQueueNotFound}, problem: true,
			contains: []string{`cluster "gke-prod" (` + gkeID + `) of Buildkite organization acme has no queue "bk-operator"`,
				"Create it (" + gke.WebURL + "/queues, New Queue, key \"bk-operator\")", "no slot of agentd can register"},
			excludes: []string{"matched exactly"},
		},
		{
			name: "queue missing, one differs in case", cfg: named,
			a:    withQueues(map[string][]Queue{gkeID: {{Key: "BK-Operator"}}}),
			want: []string{ReasonQueueNotFound}, problem: true,
			contains: []string{`the cluster has a queue "BK-Operator": queue keys are matched exactly`},
		},
		{
			name: "queue paused", cfg: named,
			a:    withQueues(map[string][]Queue{gkeID: {paused}}),
			want: []string{ReasonQueuePaused}, problem: true,
			contains: []string{`dispatch is paused on queue "bk-operator" of cluster "gke-prod" (` + gkeID + `) of Buildkite organization acme`,
				`paused by Sam Kim, at 2026-05-04T03:02:01Z, note "upgrading nodes"`, "Resume dispatch on " + paused.WebURL,
				"POST https://api.buildkite.com/v2/organizations/acme/clusters/" + gkeID + "/queues/q-1/resume_dispatch"},
		},
		{
			name: "cluster missing", cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"},
			a:    withQueues(nil),
			want: []string{ReasonClusterNotFound}, problem: true,
			contains: []string{`Buildkite organization acme has no cluster named "eks"`, `it has "gke-prod", "other"`, `with a queue "bk-operator"`, "--buildkite-cluster"},
		},
		{
			name: "cluster missing in an organization without clusters", cfg: Config{Organization: "acme", Cluster: "eks", Queue: "bk-operator"},
			a:    Answers{Token: Token{Scopes: onlyClusters}},
			want: []string{ReasonClusterNotFound}, problem: true,
			contains: []string{"it has none"},
		},
		{
			name: "two clusters of the name", cfg: named,
			a:    Answers{Token: Token{Scopes: onlyClusters}, Clusters: []Cluster{gke, {ID: otherID, Name: "gke-prod"}}},
			want: []string{ReasonClusterNotFound}, problem: true,
			contains: []string{`2 clusters of Buildkite organization acme are named "gke-prod" (UUIDs ` + gkeID + ", " + otherID + ")", "give --buildkite-cluster the UUID"},
		},
		{
			name: "no cluster named: the queue is found in one", cfg: Config{Organization: "acme", Queue: "bk-operator"},
			a:    withQueues(map[string][]Queue{otherID: {{Key: "default"}}, gkeID: {queue}}),
			want: []string{ReasonPassed}, contains: []string{`cluster "gke-prod"`, "found by searching every cluster"},
		},
		{
			name: "no cluster named: paused where it is found", cfg: Config{Organization: "acme", Queue: "bk-operator"},
			a:    withQueues(map[string][]Queue{gkeID: {paused}, otherID: {queue}}),
			want: []string{ReasonQueuePaused, ReasonPassed}, problem: true,
		},
		{
			name: "no cluster named: in none", cfg: Config{Organization: "acme", Queue: "bk-operator"},
			a:    withQueues(map[string][]Queue{gkeID: {{Key: "default"}}}),
			want: []string{ReasonQueueNotFound}, problem: true,
			contains: []string{`no cluster of Buildkite organization acme has a queue "bk-operator" (it has "gke-prod", "other")`, "give --buildkite-cluster"},
		},
		{
			name: "no cluster named, and none in the organization", cfg: Config{Organization: "acme", Queue: "bk-operator"},
			a:    Answers{Token: Token{Scopes: onlyClusters}},
			want: []string{ReasonClusterNotFound}, problem: true,
			contains: []string{"Buildkite organization acme has no cluster"},
		},
		{
			name: "no cluster named, too many to search", cfg: Config{Organization: "acme", Queue: "bk-operator"},
			a:    Answers{Token: Token{Scopes: onlyClusters}, Clusters: make([]Cluster, maxClustersSearched+1)},
			want: []string{ReasonClusterNotFound}, problem: true,
			contains: []string{"has 21 clusters, too many"},
		},
		{
			name: "token rejected", cfg: named,
			a:    Answers{TokenErr: &APIError{Call: "GET v2/access-token", Status: http.StatusUnauthorized, Message: "Authentication required. Please supply a valid API Access Token"}},
			want: []string{ReasonTokenRejected}, problem: true,
			contains: []string{"Buildkite rejected the API token of --buildkite-api-token-file (GET v2/access-token: 401 Authentication required",
				"with the read_clusters scope and access to organization acme"},
		},
		{
			name: "token rejected, organization not named", cfg: Config{Queue: "bk-operator"},
			a:    Answers{TokenErr: &APIError{Call: "GET v2/access-token", Status: http.StatusUnauthorized}},
			want: []string{ReasonTokenRejected}, problem: true,
			contains: []string{"401 Unauthorized", "with the read_clusters and read_organizations scopes and access to the organization agentd registers in"},
		},
		{
			name: "token without read_clusters", cfg: named,
			a:    Answers{Token: Token{Scopes: []string{"read_builds"}}},
			want: []string{ReasonTokenScope}, problem: true,
			contains: []string{"lacks the read_clusters scope", "Personal Settings > API Access Tokens"},
			excludes: []string{ScopeReadOrganizations},
		},
		{
			name: "token without read_organizations when it must find the organization", cfg: Config{Cluster: "gke-prod", Queue: "bk-operator"},
			a:    Answers{Token: Token{Scopes: onlyClusters}},
			want: []string{ReasonTokenScope}, problem: true,
			contains: []string{"lacks the read_organizations scope", "give it, and the token needs only read_clusters"},
		},
		{
			name: "the organization found from the token", cfg: Config{Cluster: "gke-prod", Queue: "bk-operator"},
			a: Answers{Token: Token{Scopes: both}, Organizations: []Organization{{Slug: "acme"}}, Clusters: []Cluster{gke},
				Queues: map[string][]Queue{gkeID: {queue}}},
			want: []string{ReasonPassed}, contains: []string{"organization acme"},
		},
		{
			name: "the token reaches several organizations", cfg: Config{Queue: "bk-operator"},
			a:    Answers{Token: Token{Scopes: both}, Organizations: []Organization{{Slug: "acme"}, {Slug: "globex"}}},
			want: []string{ReasonOrganizationNotFound}, problem: true,
			contains: []string{"reaches 2 organizations (acme, globex)", "--buildkite-organization"},
		},
		{
			name: "the token reaches no organization", cfg: Config{Queue: "bk-operator"},
			a:    Answers{Token: Token{Scopes: both}},
			want: []string{ReasonOrganizationNotFound}, problem: true,
			contains: []string{"reaches no organization"},
		},
		{
			name: "organization unknown", cfg: Config{Organization: "Acme", Cluster: "gke-prod", Queue: "bk-operator"},
			a: Answers{Token: Token{Scopes: onlyClusters},
				ClustersErr: &APIError{Call: "GET v2/organizations/Acme/clusters", Status: http.StatusNotFound, Message: "No organization found"}},
			want: []string{ReasonOrganizationNotFound}, problem: true,
			contains: []string{`Buildkite has no organization "Acme" that the API token reaches (GET v2/organizations/Acme/clusters: 404 No organization found)`, "lower case"},
		},
		{
			name: "scope refused by Buildkite", cfg: named,
			a: Answers{Token: Token{Scopes: onlyClusters},
				ClustersErr: &APIError{Call: "GET v2/organizations/acme/clusters", Status: http.StatusForbidden, Message: "Your access token doesn't have the read_clusters scope"}},
			want: []string{ReasonTokenScope}, problem: true,
			contains: []string{"list the clusters of organization acme", "403 Your access token doesn't have the read_clusters scope", "needs the read_clusters scope and access to organization acme"},
		},
		{
			name: "Buildkite unreachable", cfg: named,
			a:    Answers{Endpoint: "https://api.buildkite.com/", TokenErr: &APIError{Call: "GET v2/access-token", Err: errors.New("dial tcp: connection refused")}},
			want: []string{ReasonUnavailable}, problem: true,
			contains: []string{"could not read the API token's own details through Buildkite's REST API at https://api.buildkite.com/ (GET v2/access-token: dial tcp: connection refused)",
				`whether the cluster and queue "bk-operator" exist`, "restart agentd"},
		},
		{
			name: "queues of the cluster unreadable", cfg: named,
			a: Answers{Token: Token{Scopes: onlyClusters}, Clusters: []Cluster{gke},
				QueuesErr: map[string]error{gkeID: &APIError{Call: "GET queues", Status: http.StatusBadGateway}}},
			want: []string{ReasonUnavailable}, problem: true,
			contains: []string{"list the queues of cluster \"gke-prod\"", "502 Bad Gateway"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Evaluate(tc.cfg, tc.a)
			reasons := make([]string, 0, len(got))
			for _, f := range got {
				reasons = append(reasons, f.Reason)
				assert.NotEmpty(t, f.Message)
				assert.Equal(t, f.Reason != ReasonPassed, f.Problem, "only a pass is not a problem: %+v", f)
			}
			require.Equal(t, tc.want, reasons, "%+v", got)
			assert.Equal(t, tc.problem, got[0].Problem)
			for _, s := range tc.contains {
				assert.Contains(t, got[0].Message, s)
			}
			for _, s := range tc.excludes {
				assert.NotContains(t, got[0].Message, s)
			}
		})
	}
}

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"":                               "https://api.buildkite.com/",
		"https://api.buildkite.com":      "https://api.buildkite.com/",
		"https://api.buildkite.com/":     "https://api.buildkite.com/",
		"https://api.buildkite.com/v2":   "https://api.buildkite.com/",
		"https://api.buildkite.com/v2/":  "https://api.buildkite.com/",
		"http://127.0.0.1:8080/proxy/":   "http://127.0.0.1:8080/proxy/",
		"http://127.0.0.1:8080/proxy/v2": "http://127.0.0.1:8080/proxy/",
	} {
		assert.Equal(t, want, BaseURL(in), in)
	}
}
