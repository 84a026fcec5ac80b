package bench

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

func TestWarmPoolSize(t *testing.T) {
	tests := []struct {
		backend  string
		inFlight int
		want     int
	}{
		{BackendKwok, 1, 1},
		{BackendKwok, 10, 10},
		{BackendNode, 1, 2}, // issue 28's node row: one at a time, a pool of 2
		{BackendNode, 2, 2},
		{BackendNode, 10, 10},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, WarmPoolSize(tt.backend, tt.inFlight), "%s, %d in flight", tt.backend, tt.inFlight)
	}
}

func TestCheckWarm(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		err  string
	}{
		{name: "no warm phase", cfg: Config{Backend: BackendNode, InFlight: 100, Rate: 5}},
		{name: "kwok, 10 in flight", cfg: Config{Backend: BackendKwok, InFlight: 10, Warm: true}},
		{name: "the node, one at a time", cfg: Config{Backend: BackendNode, InFlight: 1, Warm: true}},
		{name: "the node, the largest pool", cfg: Config{Backend: BackendNode, InFlight: bkv1.WarmPoolMaxSize, Warm: true}},
		{
			name: "more in flight than a pool holds", cfg: Config{Backend: BackendNode, InFlight: bkv1.WarmPoolMaxSize + 1, Warm: true},
			err: "the warm-pool phase keeps a pool of 21 warm pods for 21 jobs in flight on node, and a pool holds at most 20",
		},
		{
			name: "an open loop", cfg: Config{Backend: BackendKwok, InFlight: 10, Rate: 2, Warm: true},
			err: "the warm-pool phase follows the closed loop, not an open loop (-rate)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.checkWarm()
			if tt.err == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.err)
		})
	}
}

// flagValue is the value of --name in args, given as --name value or --name=value.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func TestWebhookArgs(t *testing.T) {
	off := (&run{cfg: Config{Backend: BackendNode}, ce: &clusterEnv{}}).webhookArgs()
	assert.Equal(t, []string{"--webhooks=false"}, off, "no warm phase: no webhook server")

	tests := []struct {
		name      string
		simulated bool
		want      map[string]string
		absent    []string
	}{
		{
			name: "kwok: the stand-in on this host reaches agentd at localhost, from no pod's address", simulated: true,
			want: map[string]string{
				"webhooks": "true", "webhook-port": "9555", "webhook-service": "localhost",
				"handoff-url": "https://localhost:9555/handoff", "handoff-check-address": "false",
				"handoff-ca-configmap": warmCAConfigMap, "webhook-secret": warmWebhookSecret,
				"webhook-configuration-name": warmWebhookConfiguration,
			},
			absent: []string{"zap-time-encoding"},
		},
		{
			name: "the node: the pods reach agentd through the Service, at the default URL, from their own addresses",
			want: map[string]string{
				"webhooks": "true", "webhook-port": "9555", "webhook-service": nodeWebhookService,
				"handoff-check-address": "true", "zap-time-encoding": "rfc3339nano",
				"handoff-ca-configmap": warmCAConfigMap, "webhook-secret": warmWebhookSecret,
				"webhook-configuration-name": warmWebhookConfiguration,
			},
			absent: []string{"handoff-url"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &run{cfg: Config{Warm: true}, ce: &clusterEnv{simulated: tt.simulated}, webhookPort: 9555}
			args := r.webhookArgs()
			for name, want := range tt.want {
				got, ok := flagValue(args, name)
				assert.True(t, ok, "--%s in %v", name, args)
				assert.Equal(t, want, got, "--%s", name)
			}
			for _, name := range tt.absent {
				_, ok := flagValue(args, name)
				assert.False(t, ok, "--%s in %v", name, args)
			}
		})
	}
}

func TestHandoffObjects(t *testing.T) {
	svc := handoffService(nodeWebhookService, namespace, 9555)
	assert.Nil(t, svc.Spec.Selector, "no selector: the endpoints are the bench's")
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, corev1.ServicePort{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(9555)}, svc.Spec.Ports[0],
		"agentd's default hand-off URL has no port: https's")

	slice, err := handoffEndpointSlice(nodeWebhookService, namespace, "10.88.0.1", 9555)
	require.NoError(t, err)
	assert.Equal(t, nodeWebhookService, slice.Labels[discoveryv1.LabelServiceName])
	assert.Equal(t, discoveryv1.AddressTypeIPv4, slice.AddressType)
	require.Len(t, slice.Endpoints, 1)
	assert.Equal(t, []string{"10.88.0.1"}, slice.Endpoints[0].Addresses)
	require.Len(t, slice.Ports, 1)
	assert.Equal(t, svc.Spec.Ports[0].Name, *slice.Ports[0].Name, "kube-proxy pairs the slice's port with the Service's by name")
	assert.Equal(t, int32(9555), *slice.Ports[0].Port)

	slice, err = handoffEndpointSlice(nodeWebhookService, namespace, "fd00::1", 9555)
	require.NoError(t, err)
	assert.Equal(t, discoveryv1.AddressTypeIPv6, slice.AddressType)

	_, err = handoffEndpointSlice(nodeWebhookService, namespace, "gateway", 9555)
	assert.ErrorContains(t, err, `the host address "gateway" that warm pods reach agentd at is not an IP address`)
}

// TestServeHandoffToPods makes the Service and EndpointSlice on a real API server, which
// validates them and gives the Service its ClusterIP, the address the cluster DNS answers.
func TestServeHandoffToPods(t *testing.T) {
	env, err := testenv.Start()
	require.NoError(t, err)
	defer func() { assert.NoError(t, env.Stop()) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}))

	r := &run{c: env.Client, ce: &clusterEnv{hostAddress: "10.88.0.1"}, webhookPort: 9555}
	require.NoError(t, r.serveHandoffToPods(ctx))
	require.NoError(t, r.serveHandoffToPods(ctx), "made already: no error")

	var svc corev1.Service
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: nodeWebhookService}, &svc))
	assert.NotEmpty(t, svc.Spec.ClusterIP)
	assert.NotEqual(t, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	assert.Empty(t, svc.Spec.Selector)
	var slices discoveryv1.EndpointSliceList
	require.NoError(t, env.Client.List(ctx, &slices, client.InNamespace(namespace), client.MatchingLabels{discoveryv1.LabelServiceName: nodeWebhookService}))
	require.Len(t, slices.Items, 1)
	assert.Equal(t, []string{"10.88.0.1"}, slices.Items[0].Endpoints[0].Addresses)
	assert.Equal(t, int32(9555), *slices.Items[0].Ports[0].Port)
}

func TestParseSupervisorLog(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	line := func(ms int, text string) string { return at(ms).Format(time.RFC3339Nano) + " " + text }
	wait := line(100, "agentd supervise: warm pod: waiting for a job from https://bench-handoff.buildkite.svc/handoff")
	fail := line(300, "agentd supervise: hand-off attempt 1 failed, retrying in 250ms: dial tcp: connection refused")

	tests := []struct {
		name string
		log  string
		now  int
		want supervisorWait
		ok   bool
		why  string
	}{
		{name: "nothing logged yet", log: "", now: 5000, why: "its supervisor has not started waiting for a job"},
		{name: "waiting long enough", log: wait + "\n", now: 1100, want: supervisorWait{since: at(100)}, ok: true},
		{name: "waiting, not long enough", log: wait, now: 600, want: supervisorWait{since: at(100)}, why: "waiting for 500ms only"},
		{
			name: "an attempt failed lately", log: wait + "\n" + fail + "\n", now: 2000,
			want: supervisorWait{since: at(100), failed: at(300), lastFailure: "agentd supervise: hand-off attempt 1 failed, retrying in 250ms: dial tcp: connection refused"},
			why:  "an attempt failed 1.7s ago: agentd supervise: hand-off attempt 1 failed",
		},
		{
			name: "a failure long ago", log: wait + "\n" + fail, now: 300 + int(retryQuiet/time.Millisecond),
			want: supervisorWait{since: at(100), failed: at(300), lastFailure: "agentd supervise: hand-off attempt 1 failed, retrying in 250ms: dial tcp: connection refused"},
			ok:   true,
		},
		{
			name: "lines without a timestamp are skipped", log: "agentd supervise: warm pod: waiting for a job from x\n" + wait, now: 1100,
			want: supervisorWait{since: at(100)}, ok: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := parseSupervisorLog(tt.log)
			assert.Equal(t, tt.want, w)
			ok, why := w.asking(at(tt.now))
			assert.Equal(t, tt.ok, ok)
			if tt.why == "" {
				assert.Empty(t, why)
			} else {
				assert.Contains(t, why, tt.why)
			}
		})
	}
}

// TestParseHandoffLog reads lines logged as agentd logs them: controller-runtime's zap with
// agentd's --zap-time-encoding flag, the hand-off endpoint's logger and its keys.
func TestParseHandoffLog(t *testing.T) {
	logLines := func(flags ...string) string {
		var opts zap.Options
		fs := flag.NewFlagSet("agentd", flag.ContinueOnError)
		opts.BindFlags(fs)
		require.NoError(t, fs.Parse(flags))
		var buf bytes.Buffer
		log := zap.New(zap.UseFlagOptions(&opts), zap.WriteTo(&buf)).WithName("handoff")
		pod := func(name string) string {
			return handoff.PodRef{Namespace: namespace, Name: name, UID: types.UID("uid-" + name)}.String()
		}
		log.WithValues("remote", "10.88.0.7:41234", "pod", pod("default-warm-a")).Info(handoff.LogHandedOff, "job", "j1", "buildJob", "bj-1")
		log.WithValues("remote", "10.88.0.8:41234", "pod", pod("default-warm-b")).Info("hand-off refused", "status", 403)
		log.WithValues("remote", "10.88.0.9:41234", "pod", pod("default-warm-c")).Info(handoff.LogHandedOff, "job", "j2", "buildJob", "bj-2")
		log.WithValues("remote", "10.88.0.9:41234", "pod", pod("default-warm-d")).Info(handoff.LogHandedOff, "job", "j2", "buildJob", "bj-2")
		return buf.String()
	}

	before := time.Now()
	got, err := parseHandoffLog(strings.NewReader("panic: not JSON\n" + logLines("--zap-time-encoding=rfc3339nano") + "{\"msg\":\"" + handoff.LogHandedOff + "\",\"job\":\"j3\"}\n"))
	require.NoError(t, err)
	require.Len(t, got, 2, "j1 and j2; j3's line has no time: %v", got)
	assert.Equal(t, "default-warm-a", got["j1"].pod)
	assert.Equal(t, "default-warm-c", got["j2"].pod, "a job's first hand-off line")
	assert.False(t, got["j1"].at.Before(before.Truncate(time.Microsecond)), "to the sub-second: %s, not before %s", got["j1"].at, before)
	assert.False(t, got["j2"].at.Before(got["j1"].at))

	got, err = parseHandoffLog(strings.NewReader(logLines("--zap-time-encoding=epoch")))
	require.NoError(t, err)
	require.Contains(t, got, "j1", "seconds since the epoch are read too")
	assert.WithinDuration(t, time.Now(), got["j1"].at, time.Minute)
}

// The bench reads other packages' log lines as text: they must say what it looks for.
func TestLogLinesTheBenchReads(t *testing.T) {
	for _, c := range []struct{ file, text string }{
		{"pkg/supervisor/handoff.go", `logf("` + supervisorWaitLine + `%s"`},
		{"pkg/handoff/handoffclient/client.go", `c.logf("` + supervisorFailLine + `%d failed`},
	} {
		b, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), c.file))
		require.NoError(t, err)
		assert.Contains(t, string(b), c.text, "%s no longer logs what the bench's node warm phase reads", c.file)
	}
}

func TestIdleWarmPod(t *testing.T) {
	running := corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "sidecar", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		{Name: podcontract.JobContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
	}}
	pod := func(f func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "default-warm-a", Labels: map[string]string{podbuilder.LabelWarmPool: warmEnvironment},
				OwnerReferences: []metav1.OwnerReference{{Kind: "BuildEnvironment", Name: warmEnvironment, Controller: ptr.To(true)}}},
			Status: *running.DeepCopy(),
		}
		f(p)
		return p
	}
	now := metav1.Now()
	tests := []struct {
		name          string
		pod           *corev1.Pod
		idle, running bool
	}{
		{"idle and running", pod(func(*corev1.Pod) {}), true, true},
		{"pending", pod(func(p *corev1.Pod) { p.Status = corev1.PodStatus{Phase: corev1.PodPending} }), true, false},
		{"its job container not started", pod(func(p *corev1.Pod) { p.Status.ContainerStatuses[1].State = corev1.ContainerState{} }), true, false},
		{"taken: the job's label", pod(func(p *corev1.Pod) { p.Labels[bkv1.LabelJob] = "j1" }), false, false},
		{"taken: its BuildJob's", pod(func(p *corev1.Pod) { p.OwnerReferences[0].Kind = "BuildJob" }), false, false},
		{"going", pod(func(p *corev1.Pod) { p.DeletionTimestamp = &now }), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idle, running := idleWarmPod(tt.pod)
			assert.Equal(t, tt.idle, idle, "idle")
			assert.Equal(t, tt.running, running, "running")
		})
	}
}
