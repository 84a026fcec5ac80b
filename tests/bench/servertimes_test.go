package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseServerTimes(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	event := func(stage, verb, user, resource, sub, ns, name string, code, ms int) string {
		return fmt.Sprintf(`{"stage":%q,"verb":%q,"user":{"username":%q},"objectRef":{"resource":%q,"subresource":%q,"namespace":%q,"name":%q},"responseStatus":{"code":%d},"requestReceivedTimestamp":"2026-11-27T09:00:00Z","stageTimestamp":%q}`,
			stage, verb, user, resource, sub, ns, name, code, at(ms).Format(time.RFC3339Nano))
	}
	const done = "ResponseComplete"
	log := strings.Join([]string{
		event(done, "create", "admin", "pods", "", namespace, "bare-0", 201, 10),
		event("ResponseStarted", "create", "admin", "pods", "", namespace, "bare-1", 201, 11), // not the end of the request
		event(done, "create", "admin", "pods", "", namespace, "bare-1", 201, 12),
		event(done, "create", "admin", "pods", "", "other", "bare-0", 201, 1), // another namespace
		event(done, "create", "bench:kube-scheduler", "pods", "binding", namespace, "bare-0", 201, 20),
		event(done, "patch", "bench:kwok", "pods", "status", namespace, "bare-0", 200, 70),
		event(done, "patch", "bench:kwok", "pods", "status", namespace, "bare-0", 200, 90), // a later status write
		event(done, "patch", "bench:kwok", "pods", "status", namespace, "bare-1", 409, 50), // refused
		event(done, "update", "bench:kwok", "pods", "status", namespace, "bare-1", 200, 112),
		event(done, "update", "admin", "pods", "status", namespace, "job-pod", 200, 150), // the stand-in's, not kwok's
		event(done, "create", "bench:agentd", "buildjobs", "", namespace, "bj-1", 201, 200),
		event(done, "update", "bench:agentd", "buildjobs", "status", namespace, "bj-1", 200, 210),
		event(done, "create", "bench:agentd", "pods", "", namespace, "job-pod", 201, 230),
		event(done, "patch", "bench:kwok", "pods", "status", namespace, "job-pod", 200, 300),
		// A warm pod: created by agentd's keeper, assigned by its first patch.
		event(done, "create", "bench:agentd", "pods", "", namespace, "warm-a", 201, 310),
		event(done, "patch", "bench:agentd", "pods", "", namespace, "warm-a", 409, 320), // refused: another job took it
		event(done, "patch", "admin", "pods", "", namespace, "warm-a", 200, 325),        // not agentd's
		event(done, "patch", "bench:agentd", "pods", "status", namespace, "warm-a", 200, 328),
		event(done, "patch", "bench:agentd", "pods", "", namespace, "warm-a", 200, 330),
		event(done, "patch", "bench:agentd", "pods", "", namespace, "warm-a", 200, 900), // its finalizer removed, later
		// The node: agentd shares the admin's user with the bench, and is told by its user agent.
		withUserAgent(event(done, "patch", "admin", "pods", "", namespace, "warm-n", 200, 950), "bench"),
		withUserAgent(event(done, "patch", "admin", "pods", "", namespace, "warm-n", 200, 960), "agentd/v0.0.0 (linux/amd64) kubernetes/$Format"),
	}, "\n")
	st, err := parseServerTimes(strings.NewReader(log))
	require.NoError(t, err)
	assert.Equal(t, map[string]time.Time{"bare-0": at(10), "bare-1": at(12), "job-pod": at(230), "warm-a": at(310)}, st.podCreated)
	assert.Equal(t, map[string]time.Time{"warm-a": at(330), "warm-n": at(960)}, st.podPatched, "agentd's first patch of a pod that succeeded")
	assert.Equal(t, map[string]time.Time{"bare-0": at(70), "bare-1": at(112), "job-pod": at(300)}, st.podRunning)
	assert.Equal(t, map[string]time.Time{"bj-1": at(200)}, st.buildJobCreated)

	floor, ok := st.barePods(2)
	require.True(t, ok)
	assert.Equal(t, Stats{Samples: 2, P50: 60, P95: 100, P99: 100}, floor)
	_, ok = st.barePods(3)
	assert.False(t, ok, "bare-2 is not in the log")

	seen := map[string]observed{
		"j1": {buildJobName: "bj-1", podName: "job-pod", buildJob: at(400), podCreated: at(500), podRunning: at(500)},
		"j2": {buildJobName: "bj-2", buildJob: at(600)}, // not in the log: the watch's moment stays
	}
	got := st.apply(seen)
	assert.Equal(t, observed{buildJobName: "bj-1", podName: "job-pod", buildJob: at(200), podCreated: at(230), podRunning: at(300)}, got["j1"])
	assert.Equal(t, seen["j2"], got["j2"])
	assert.Equal(t, at(500), seen["j1"].podRunning, "the watch's record is left as it was")
}

// withUserAgent adds a user agent to an audit event's line.
func withUserAgent(event, ua string) string {
	return strings.Replace(event, `{"stage":`, fmt.Sprintf(`{"userAgent":%q,"stage":`, ua), 1)
}

func TestParseServerTimesBadLine(t *testing.T) {
	_, err := parseServerTimes(strings.NewReader("{not json"))
	assert.Error(t, err)
}
