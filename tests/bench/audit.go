package bench

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/auditlog"
)

// operatorClient is agentd's name in the audit log: client-go's user agent starts with the
// program's name.
const operatorClient = "agentd"

type requestKey struct{ client, verb, resource string }

// userPrefix starts the names of the users the kwok backend gives each component.
const userPrefix = "bench:"

// clientOf names the client of a request: the component a kwok backend user was made for,
// else the program in its user agent ("agentd", "kubelet", "kube-scheduler", "bench"),
// else its user.
func clientOf(e *auditlog.Event) string { return clientName(e.User.Username, e.UserAgent) }

// clientName is clientOf for a request's user and user agent.
func clientName(username, userAgent string) string {
	if name, ok := strings.CutPrefix(username, userPrefix); ok {
		return name
	}
	if prog, _, _ := strings.Cut(userAgent, "/"); prog != "" {
		return prog
	}
	return username
}

func isWrite(verb string) bool {
	switch verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// countRequests counts the requests the API server received in [from, to], once each
// (a watch has two events, when its response starts and when it ends).
func countRequests(r io.Reader, from, to time.Time) (map[requestKey]int, error) {
	counts := map[requestKey]int{}
	seen := map[string]bool{}
	err := auditlog.Each(r, func(e *auditlog.Event) error {
		if seen[e.AuditID] || e.RequestReceived.Before(from) || e.RequestReceived.After(to) {
			return nil
		}
		seen[e.AuditID] = true
		counts[requestKey{clientOf(e), e.Verb, e.Resource()}]++
		return nil
	})
	return counts, err
}

// requestsPerJob reads the audit log at path and divides the requests in [from, to] by jobs.
func requestsPerJob(path string, from, to time.Time, jobs int) (Requests, error) {
	f, err := os.Open(path)
	if err != nil {
		return Requests{}, fmt.Errorf("opening the API server's audit log: %w", err)
	}
	defer func() { _ = f.Close() }()
	counts, err := countRequests(f, from, to)
	if err != nil {
		return Requests{}, fmt.Errorf("%s: %w", path, err)
	}
	return summarize(counts, jobs, from, to), nil
}

// summarize divides counts by jobs: the total, per client, and per client, verb and
// resource, the largest first.
func summarize(counts map[requestKey]int, jobs int, from, to time.Time) Requests {
	out := Requests{Window: [2]time.Time{from, to}}
	if jobs <= 0 {
		return out
	}
	n := float64(jobs)
	clients := map[string]*ClientCount{}
	for k, c := range counts {
		per := float64(c) / n
		out.Total += per
		cc := clients[k.client]
		if cc == nil {
			cc = &ClientCount{Client: k.client}
			clients[k.client] = cc
		}
		if isWrite(k.verb) {
			out.Writes += per
			cc.Writes += per
			if k.client == operatorClient {
				out.OperatorWrites += per
			}
		} else {
			cc.Reads += per
		}
		out.Detail = append(out.Detail, RequestCount{Client: k.client, Verb: k.verb, Resource: k.resource, PerJob: per})
	}
	for _, cc := range clients {
		out.ByClient = append(out.ByClient, *cc)
	}
	slices.SortFunc(out.ByClient, func(a, b ClientCount) int {
		return cmpDesc(a.Reads+a.Writes, b.Reads+b.Writes, a.Client, b.Client)
	})
	slices.SortFunc(out.Detail, func(a, b RequestCount) int {
		return cmpDesc(a.PerJob, b.PerJob, a.Client+" "+a.Verb+" "+a.Resource, b.Client+" "+b.Verb+" "+b.Resource)
	})
	return out
}

// cmpDesc orders by x, largest first, then by name.
func cmpDesc(x, y float64, a, b string) int {
	switch {
	case x > y:
		return -1
	case x < y:
		return 1
	}
	return strings.Compare(a, b)
}
