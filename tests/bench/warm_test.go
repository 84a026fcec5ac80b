package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/buildkite-operator/buildkite-operator/pkg/handoff/handoffclient"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

func TestWarmMoments(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	jobs := []fakebuildkite.JobSnapshot{
		{ID: "j1", AcceptedAt: at(0), StartedAt: at(60)},
		// Started cold: no hand-off; its BuildJob's create is not in the log, so the watch's stays.
		{ID: "j2", AcceptedAt: at(10), StartedAt: at(900)},
		// Handed off, but the log lacks its pod's assignment: only the spans it has.
		{ID: "j3", AcceptedAt: at(20), StartedAt: at(100)},
	}
	seen := map[string]observed{
		"j1": {buildJobName: "bj-1", buildJob: at(99)},
		"j2": {buildJobName: "bj-2", buildJob: at(30)},
		"j3": {buildJobName: "bj-3", buildJob: at(99)},
	}
	st := serverTimes{
		buildJobCreated: map[string]time.Time{"bj-1": at(15), "bj-3": at(40)},
		podPatched:      map[string]time.Time{"warm-a": at(25)},
	}
	handoffs := map[string]handoffSeen{"j1": {pod: "warm-a", at: at(40)}, "j3": {pod: "warm-b", at: at(70)}}

	m, warm := warmMoments(jobs, seen, st, handoffs)
	assert.Equal(t, 2, warm, "j1 and j3 started warm")
	require.Len(t, m, 3)
	assert.Equal(t, [nWarmMoments]time.Time{at(0), at(15), at(25), at(40), at(60)}, m[0])
	assert.Equal(t, [nWarmMoments]time.Time{wAccepted: at(10), wBuildJob: at(30), wStarted: at(900)}, m[1])
	assert.Equal(t, [nWarmMoments]time.Time{wAccepted: at(20), wBuildJob: at(40), wHandedOff: at(70), wStarted: at(100)}, m[2])

	ps := warmPhases(m, warmPhaseDefs)
	require.Len(t, ps, len(warmPhaseDefs))
	byName := map[string]Stats{}
	for _, p := range ps {
		byName[p.Name] = p.Stats
	}
	assert.Equal(t, Stats{Samples: 3, P50: 20, P95: 20, P99: 20}, byName["accepted → BuildJob created"])
	assert.Equal(t, Stats{Samples: 1, P50: 10, P95: 10, P99: 10}, byName["BuildJob created → warm pod assigned (agentd's patch)"])
	assert.Equal(t, Stats{Samples: 2, P50: 20, P95: 30, P99: 30}, byName["job handed off → supervisor start (the stand-in)"])
	assert.Equal(t, Stats{Samples: 3, P50: 80, P95: 890, P99: 890}, byName[warmPickupPhase], "every job's pickup, the cold one's too")
}

func TestWarmEnv(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "sidecar", Env: []corev1.EnvVar{{Name: "SIDE", Value: "x"}}},
		{Name: podcontract.JobContainer, Env: []corev1.EnvVar{
			{Name: "POD_ONLY", Value: "pod"},
			{Name: "BOTH", Value: "pod"},
			{Name: "FROM_FIELD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: podcontract.EnvHandoffURL, Value: "https://localhost:9443/handoff"},
			{Name: podcontract.EnvHandoffTokenPath, Value: "/var/run/handoff/token"},
			{Name: podcontract.EnvHandoffCAPath, Value: "/var/run/handoff/ca.crt"},
		}},
	}}}
	job := handoffclient.Job{ID: "job-1", Token: "secret", Env: map[string]string{"BOTH": "job", podcontract.EnvEndpoint: "http://bk"}}
	assert.Equal(t, map[string]string{
		"POD_ONLY": "pod", "BOTH": "job", podcontract.EnvEndpoint: "http://bk",
		podcontract.EnvJobID: "job-1", podcontract.EnvAccessToken: "secret",
	}, warmEnv(pod, job), "the pod's own env less the hand-off's, the job's over it, its ID and token")
}

func TestProjectionOf(t *testing.T) {
	exp := int64(3600)
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: podcontract.JobContainer, VolumeMounts: []corev1.VolumeMount{
			{Name: "workspace", MountPath: "/workspace"},
			{Name: "handoff", MountPath: "/var/run/handoff/"},
		}}},
		Volumes: []corev1.Volume{
			{Name: "workspace"},
			{Name: "handoff", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "aud", ExpirationSeconds: &exp, Path: "token"}},
				{ConfigMap: &corev1.ConfigMapProjection{
					LocalObjectReference: corev1.LocalObjectReference{Name: "ca"},
					Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.pem"}},
				}},
			}}}},
		},
	}}
	src, key, err := projectionOf(pod, "/var/run/handoff/token")
	require.NoError(t, err)
	require.NotNil(t, src.ServiceAccountToken)
	assert.Equal(t, "aud", src.ServiceAccountToken.Audience)
	assert.Empty(t, key)

	src, key, err = projectionOf(pod, "/var/run/handoff/ca.pem")
	require.NoError(t, err)
	require.NotNil(t, src.ConfigMap)
	assert.Equal(t, "ca", src.ConfigMap.Name)
	assert.Equal(t, "ca.crt", key, "the ConfigMap's key, not the file's name")

	for _, p := range []string{"/var/run/handoff/ca.crt", "/workspace/token", "/var/run/handoffx/token"} {
		_, _, err = projectionOf(pod, p)
		assert.ErrorContains(t, err, "no projected volume of its job container holds "+p)
	}
}

func TestPrintRunsWarm(t *testing.T) {
	run := func(pickup, warmPickup float64, warm int) *Result {
		r := &Result{
			Backend: BackendKwok, Mode: ModeClosed, InFlight: 10, Jobs: 20, Passed: 20,
			BarePod: Stats{Samples: 10, P50: 100},
			Phases:  []Phase{{Name: pickupPhase, Stats: Stats{Samples: 20, P50: pickup}, Floor: true}},
		}
		return withWarm(r, warmPickup, warm)
	}
	var out strings.Builder
	PrintRuns(&out, []*Result{run(300, 50, 20), run(400, 70, 20), run(350, 90, 19)})
	text := out.String()
	for _, want := range []string{
		"warm pool: agentd serves its webhook server (the hand-off endpoint) in both phases",
		"| **warm pool** of 10 after the jobs above, 2 round(s) of 10 jobs at once: jobs started in a warm pod / jobs | 19 / 20 | 20 / 20 | 20 / 20 |",
		"|   warm: accepted → BuildJob created | 20 ms / 0 ms / 0 ms |",
		"| **warm pickup**: " + warmPickupPhase + " | 50 ms / 0 ms / 0 ms | 70 ms / 0 ms / 0 ms | 90 ms / 0 ms / 0 ms |",
	} {
		assert.Contains(t, text, want)
	}
	pickupAt := strings.Index(text, "pickup p50 − floor p50")
	warmAt := strings.Index(text, "**warm pool**")
	assert.True(t, pickupAt >= 0 && warmAt > pickupAt, "the warm rows follow the cold pickup's")

	out.Reset()
	PrintRuns(&out, []*Result{{Backend: BackendKwok, Mode: ModeClosed, InFlight: 10, Jobs: 20, Phases: []Phase{{Name: pickupPhase, Floor: true}}}})
	assert.NotContains(t, out.String(), "warm", "no warm rows without the phase")
}

func TestPrintRunsWarmNode(t *testing.T) {
	r := &Result{
		Backend: BackendNode, Mode: ModeClosed, InFlight: 1, Jobs: 2, Passed: 2,
		BarePod: Stats{Samples: 1, P50: 900},
		Phases:  []Phase{{Name: pickupPhase, Stats: Stats{Samples: 2, P50: 1700}, Floor: true}},
	}
	r = withWarm(r, 240, 2)
	var out strings.Builder
	PrintRuns(&out, []*Result{r})
	text := out.String()
	for _, want := range []string{
		"each warm pod's own supervisor fetches its job from that endpoint through Service bench-handoff to this host",
		"| **warm pool** of 2 after the jobs above, 2 round(s) of 1 jobs at once: jobs started in a warm pod / jobs | 2 / 2 |",
		"| **warm pickup**: " + nodeWarmPickupPhase + " | 240 ms / 0 ms / 0 ms |",
	} {
		assert.Contains(t, text, want)
	}
	assert.NotContains(t, text, "the stand-in fetches")
}

func TestWarmPhaseDefsFor(t *testing.T) {
	kwok, node := warmPhaseDefsFor(BackendKwok), warmPhaseDefsFor(BackendNode)
	require.Len(t, node, len(kwok))
	for i := range kwok {
		assert.Equal(t, [2]int{kwok[i].from, kwok[i].to}, [2]int{node[i].from, node[i].to}, "the same moments: %q", node[i].name)
		assert.NotContains(t, node[i].name, "stand-in", "no stand-in on the node")
	}
	assert.Equal(t, nodeWarmPickupPhase, node[len(node)-1].name)
	assert.Equal(t, warmPickupPhase, kwok[len(kwok)-1].name)

	// Either backend's pickup phase is the pickup.
	for _, name := range []string{warmPickupPhase, nodeWarmPickupPhase} {
		w := &WarmResult{Phases: []Phase{{Name: "other", Stats: Stats{Samples: 1, P50: 1}}, {Name: name, Stats: Stats{Samples: 2, P50: 240}}}}
		got, ok := w.pickup()
		assert.True(t, ok)
		assert.Equal(t, 240.0, got.P50)
	}
}
