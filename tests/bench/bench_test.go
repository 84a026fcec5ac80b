package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

// TestKwokSmall runs the whole bench at a small size so that `make test` keeps it working:
// every phase of every job is measured, requests are counted, agentd is measured, and the
// warm-pool phase hands every one of its jobs to a warm pod through agentd's hand-off
// endpoint. It asserts that the table is complete, not how fast anything is. It runs with
// the end-to-end tests (`make test-e2e`, E2E=1), after kwok is built beside the unit tests.
func TestKwokSmall(t *testing.T) {
	if os.Getenv("E2E") != "1" {
		t.Skip("the bench's kwok run is part of `make test-e2e` (E2E=1), which builds kwok first: run `make kwok` and `E2E=1 go test -run TestKwokSmall ./tests/bench/`")
	}
	const n = 5
	log.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{Backend: BackendKwok, InFlight: n, Rounds: 2, Timeout: 5 * time.Minute, Warm: true, Dir: t.TempDir(), Logf: t.Logf})
	require.NoError(t, err)
	var out strings.Builder
	res.Print(&out)
	t.Log("\n" + out.String())

	assert.Equal(t, 2*n, res.Jobs)
	assert.Equal(t, res.Jobs, res.Passed, "every job passes")
	assert.Positive(t, res.JobsPerSecond)
	assert.Equal(t, n, res.BarePod.Samples, "every bare pod ran")
	assert.Equal(t, momentsFromServer, res.MomentsFrom, "the audit log has the moments of every bare pod")
	require.Len(t, res.Phases, len(phaseDefs))
	for _, p := range res.Phases {
		assert.Equal(t, res.Jobs, p.Samples, "phase %q has a sample for every job", p.Name)
	}
	assert.Positive(t, res.Requests.Total)
	assert.Positive(t, res.Requests.OperatorWrites)
	clients := map[string]bool{}
	for _, c := range res.Requests.ByClient {
		clients[c.Client] = true
	}
	for _, c := range []string{operatorClient, "kwok", "kube-scheduler"} {
		assert.True(t, clients[c], "the audit log has requests from %s: %v", c, res.Requests.ByClient)
	}
	assert.Positive(t, res.Agentd.PeakRSSMiB)
	assert.Positive(t, res.Agentd.CPUSecondsTotal)
	// Every process of the run is measured, found under the bench process: those it
	// starts, and envtest's.
	for _, p := range []string{benchProcess, "agentd", "kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok"} {
		assert.Contains(t, processNames(res.CPU), p)
	}
	assert.Positive(t, res.CPU.seconds("kube-apiserver"), "the API server worked in the window")
	assert.GreaterOrEqual(t, len(res.Samples), 2, "agentd sampled at both ends of the window at least")
	assert.Positive(t, res.Samples[len(res.Samples)-1].RSSMiB)
	assert.Equal(t, res.Jobs, res.Samples[len(res.Samples)-1].Finished)
	assert.GreaterOrEqual(t, res.Samples[len(res.Samples)-1].Secrets, res.Jobs, "every job's token Secret is counted")
	assert.Contains(t, res.Limits, ClientLimit{Client: "kube-scheduler", QPS: SchedulerQPS, Burst: SchedulerBurst, From: "its configuration file"})
	assert.Contains(t, res.Limits, ClientLimit{Client: operatorClient, QPS: 200, Burst: 400, From: "its defaults"}, "read from `agentd operator -h`")

	require.NotNil(t, res.Warm, "the warm-pool phase ran")
	assert.Equal(t, WarmResult{PoolSize: n, Rounds: 2, Jobs: 2 * n, Passed: 2 * n, Warm: 2 * n},
		WarmResult{PoolSize: res.Warm.PoolSize, Rounds: res.Warm.Rounds, Jobs: res.Warm.Jobs, Passed: res.Warm.Passed, Warm: res.Warm.Warm},
		"every warm-phase job passed, and started in a warm pod")
	require.Len(t, res.Warm.Phases, len(warmPhaseDefs))
	for _, p := range res.Warm.Phases {
		assert.Equal(t, 2*n, p.Samples, "warm phase %q has a sample for every job", p.Name)
	}
	assert.Positive(t, res.Warm.Requests.OperatorWrites)
}

func processNames(c CPU) []string {
	var out []string
	for _, p := range c.Processes {
		out = append(out, p.Name)
	}
	return out
}

func TestPercentiles(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var ds []time.Duration
		for _, v := range vs {
			ds = append(ds, time.Duration(v)*time.Millisecond)
		}
		return ds
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // unsorted on purpose
	}
	tests := []struct {
		name string
		in   []time.Duration
		want Stats
	}{
		{"none", nil, Stats{}},
		{"one", ms(7), Stats{Samples: 1, P50: 7, P95: 7, P99: 7}},
		{"nearest rank", ms(hundred...), Stats{Samples: 100, P50: 50, P95: 95, P99: 99}},
		{"negative", ms(-5, 10), Stats{Samples: 2, P50: -5, P95: 10, P99: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, percentiles(tt.in))
		})
	}
}

func TestCountRequests(t *testing.T) {
	from := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	to := from.Add(time.Minute)
	log := strings.Join([]string{
		// Before the window: not counted.
		`{"auditID":"a0","stage":"ResponseComplete","verb":"create","userAgent":"agentd/v0.0.0 (linux/amd64)","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"2026-11-23T09:59:59.000000Z"}`,
		`{"auditID":"a1","stage":"ResponseComplete","verb":"create","userAgent":"agentd/v0.0.0 (linux/amd64)","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"2026-11-23T10:00:01.000000Z"}`,
		`{"auditID":"a2","stage":"ResponseComplete","verb":"update","userAgent":"agentd/v0.0.0 (linux/amd64)","objectRef":{"resource":"buildjobs","subresource":"status"},"requestReceivedTimestamp":"2026-11-23T10:00:02.000000Z"}`,
		// A watch: two events, one request. The kwok backend's users name their component.
		`{"auditID":"a3","stage":"ResponseStarted","verb":"watch","user":{"username":"bench:kwok"},"userAgent":"kwok-v0.8.0/v0.0.0","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"2026-11-23T10:00:03.000000Z"}`,
		`{"auditID":"a3","stage":"ResponseComplete","verb":"watch","user":{"username":"bench:kwok"},"userAgent":"kwok-v0.8.0/v0.0.0","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"2026-11-23T10:00:03.000000Z"}`,
		// No user agent: the user names the client; no objectRef: the path is the resource.
		`{"auditID":"a4","stage":"ResponseComplete","verb":"get","user":{"username":"system:apiserver"},"requestURI":"/readyz?verbose","requestReceivedTimestamp":"2026-11-23T10:00:04.000000Z"}`,
		// After the window.
		`{"auditID":"a5","stage":"ResponseComplete","verb":"delete","userAgent":"agentd/v0.0.0","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"2026-11-23T10:01:01.000000Z"}`,
	}, "\n")
	counts, err := countRequests(strings.NewReader(log), from, to)
	require.NoError(t, err)
	assert.Equal(t, map[requestKey]int{
		{"agentd", "create", "pods"}:             1,
		{"agentd", "update", "buildjobs/status"}: 1,
		{"kwok", "watch", "pods"}:                1,
		{"system:apiserver", "get", "/readyz"}:   1,
	}, counts)

	sum := summarize(counts, 2, from, to)
	assert.InDelta(t, 2.0, sum.Total, 1e-9)
	assert.InDelta(t, 1.0, sum.Writes, 1e-9)
	assert.InDelta(t, 1.0, sum.OperatorWrites, 1e-9, "agentd's create and update over 2 jobs")
	assert.Equal(t, ClientCount{Client: "agentd", Writes: 1}, sum.ByClient[0])
}

func TestJobMoments(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	jobs := []fakebuildkite.JobSnapshot{{
		ID: "j1", CreatedAt: at(-20), AcceptedBy: "agent-1", AcceptedAt: at(110), StartedAt: at(900), FinishedAt: at(2000),
	}, {
		// Not yet started or finished: its later moments stay zero.
		ID: "j2", AcceptedBy: "agent-2", AcceptedAt: at(50),
	}}
	reqs := []fakebuildkite.Request{
		{Endpoint: fakebuildkite.EPPing, AgentID: "agent-1", Time: at(0)},
		{Endpoint: fakebuildkite.EPPing, AgentID: "agent-1", Time: at(100)}, // hands out j1
		{Endpoint: fakebuildkite.EPPing, AgentID: "agent-1", Time: at(3000)},
		{Endpoint: fakebuildkite.EPPing, AgentID: "agent-2", Time: at(40)},
		{Endpoint: fakebuildkite.EPChunks, JobID: "j1", Status: 201, Time: at(1500)},
		{Endpoint: fakebuildkite.EPChunks, JobID: "j1", Status: 201, Time: at(1200)},
		{Endpoint: fakebuildkite.EPChunks, JobID: "j1", Status: 503, Time: at(1900)}, // refused: not the command's
	}
	seen := map[string]observed{"j1": {buildJob: at(200), podCreated: at(300), podRunning: at(800)}}
	m := jobMoments(jobs, reqs, seen)
	require.Len(t, m, 2)
	assert.Equal(t, [nMoments]time.Time{at(-20), at(100), at(110), at(200), at(300), at(800), at(900), at(1500), at(2000)}, m[0])
	assert.Equal(t, at(40), m[1][tPing])
	assert.True(t, m[1][tStarted].IsZero())

	ps := phases(m, false)
	require.Len(t, ps, len(phaseDefs))
	byName := map[string]Phase{}
	for _, p := range ps {
		byName[p.Name] = p
	}
	assert.Equal(t, Stats{Samples: 1, P50: 120, P95: 120, P99: 120}, byName["job created → ping hands it out: the wait for a free slot's ping"].Stats)
	assert.Equal(t, Stats{Samples: 2, P50: 10, P95: 10, P99: 10}, byName["ping hands out the job → accepted"].Stats, "10 ms for both jobs")
	assert.Equal(t, Stats{Samples: 1, P50: 500, P95: 500, P99: 500}, byName["command end → finish received: the product's supervisor (target p99 < 500 ms)"].Stats)
	pickup := byName[pickupPhase]
	assert.Equal(t, 1, pickup.Samples, "only j1 has started")
	assert.True(t, pickup.Floor)
	assert.InDelta(t, 790.0-50, pickupOverFloor(ps, Stats{Samples: 1, P50: 50}), 1e-9, "pickup 790 ms over a 50 ms floor")
}

func TestControllerStats(t *testing.T) {
	scrape := func(reconciles, busy, waits, waited float64) metrics {
		text := fmt.Sprintf(`# HELP controller_runtime_reconcile_total Total number of reconciliations per controller
# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="buildjob",result="success"} %g
controller_runtime_reconcile_total{controller="buildjob",result="requeue_after"} 1
controller_runtime_reconcile_total{controller="buildenvironment",result="success"} 99
controller_runtime_reconcile_time_seconds_sum{controller="buildjob"} %g
controller_runtime_reconcile_time_seconds_count{controller="buildjob"} %g
controller_runtime_max_concurrent_reconciles{controller="buildjob"} 4
workqueue_queue_duration_seconds_sum{controller="buildjob",name="buildjob"} %g
workqueue_queue_duration_seconds_count{controller="buildjob",name="buildjob"} %g
`, reconciles, busy, reconciles+1, waited, waits)
		m, err := parseMetrics(strings.NewReader(text))
		require.NoError(t, err)
		return m
	}
	before := scrape(10, 2, 11, 1)
	after := scrape(110, 42, 111, 51)
	got := controllerStats(before, after, 20*time.Second, 50)
	assert.Equal(t, 4, got.Workers)
	assert.InDelta(t, 2.0, got.ReconcilesPerJob, 1e-9, "100 reconciles for 50 jobs")
	assert.InDelta(t, 400.0, got.MeanReconcileMs, 1e-9, "40 s over 100 reconciles")
	assert.InDelta(t, 500.0, got.MeanQueueWaitMs, 1e-9, "50 s over 100 waits")
	assert.InDelta(t, 0.5, got.WorkersBusy, 1e-9, "40 s of 4 workers × 20 s")
}
