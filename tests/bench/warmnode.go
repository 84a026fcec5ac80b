package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/handoff"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// On the node backend the warm pods are real: their own supervisors (`agentd supervise`)
// fetch their jobs from agentd's hand-off endpoint, and no stand-in plays any part. agentd
// still runs on this host, so the bench makes the path a cluster would have: a Service
// without a selector, named as agentd's --webhook-service, and an EndpointSlice pointing at
// this host's address on the pods' bridge (cluster.Cluster.HostAddress) and agentd's webhook
// port. The pods reach it at agentd's default hand-off URL,
// https://<service>.<namespace>.svc/handoff, through the node's cluster DNS and kube-proxy,
// which keep the pods' source addresses, so agentd checks that each token comes from its
// pod's address as it does in a cluster (--handoff-check-address=true). agentd's certificate
// manager mints its certificate for the Service's names, that one among them.
//
// What the bench cannot see on the node, it reads from agentd's log: the moment agentd
// answered a warm pod's fetch with its job (pkg/handoff logs "handed off a job to its warm
// pod" at info, with the pod and the job), with the log's timestamps made precise
// (--zap-time-encoding=rfc3339nano). Whether a warm pod waits at the endpoint, which the
// stand-in knows on kwok, is read from the pod's own log: its supervisor says when it
// starts waiting, and each attempt that failed.
const (
	// nodeWebhookService is agentd's --webhook-service on the node: the Service warm pods
	// reach agentd through.
	nodeWebhookService = "bench-handoff"
	// nodeServicePort is the Service's port: https's, as the default hand-off URL has none.
	nodeServicePort     = 443
	nodeServicePortName = "https"
	// nodeWarmPoolMin is the node's smallest pool: issue 28's node row is one job at a time
	// with a warm pool of 2.
	nodeWarmPoolMin = 2
	// askSettle is how long a warm pod's supervisor has been waiting, with no failed attempt
	// since, before the bench counts it as asking: it logs the wait just before its first
	// request, which still has a TLS handshake and agentd's TokenReview ahead of it.
	askSettle = time.Second
	// supervisorWaitLine and supervisorFailLine are what a warm pod's supervisor logs when
	// it starts waiting for its job (pkg/supervisor) and when an attempt failed
	// (handoffclient), before it tries again.
	supervisorWaitLine = "warm pod: waiting for a job from "
	supervisorFailLine = "hand-off attempt "
)

// WarmPoolSize is the warm phase's pool for inFlight jobs at once on backend: as large as
// the load on kwok (issue 28's kwok row), at least nodeWarmPoolMin on the node, so that one
// job at a time runs with the pool of 2 the node row names.
func WarmPoolSize(backend string, inFlight int) int {
	if backend == BackendNode {
		return max(nodeWarmPoolMin, inFlight)
	}
	return inFlight
}

// handoffService is the Service without a selector warm pods reach agentd's hand-off
// endpoint through: its endpoints are handoffEndpointSlice's, not pods'.
func handoffService(name, ns string, targetPort int) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{{
				Name: nodeServicePortName, Protocol: corev1.ProtocolTCP,
				Port: nodeServicePort, TargetPort: intstr.FromInt32(int32(targetPort)),
			}},
		},
	}
}

// handoffEndpointSlice points the Service named service at hostIP:port, where agentd's
// webhook server listens on this host. kube-proxy pairs it with the Service by the
// service-name label and the port's name.
func handoffEndpointSlice(service, ns, hostIP string, port int) (*discoveryv1.EndpointSlice, error) {
	ip := net.ParseIP(hostIP)
	if ip == nil {
		return nil, fmt.Errorf("the host address %q that warm pods reach agentd at is not an IP address", hostIP)
	}
	family := discoveryv1.AddressTypeIPv4
	if ip.To4() == nil {
		family = discoveryv1.AddressTypeIPv6
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: service + "-host", Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: service,
			// Not the endpoint slice controller's: it leaves a slice it does not manage alone.
			discoveryv1.LabelManagedBy: "bench.buildkite-operator.dev",
		}},
		AddressType: family,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{hostIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To(nodeServicePortName), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP),
		}},
	}, nil
}

// serveHandoffToPods creates the Service and EndpointSlice that bring the node's warm pods to
// agentd's webhook server on this host, at r.webhookPort.
func (r *run) serveHandoffToPods(ctx context.Context) error {
	slice, err := handoffEndpointSlice(nodeWebhookService, namespace, r.ce.hostAddress, r.webhookPort)
	if err != nil {
		return err
	}
	for _, obj := range []client.Object{handoffService(nodeWebhookService, namespace, r.webhookPort), slice} {
		if err := r.c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the %T %s that brings warm pods to agentd's hand-off endpoint: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}

// supervisorWait is what a warm pod's supervisor logged of its wait for a job: when it
// began, and its last failed attempt after that.
type supervisorWait struct {
	since, failed time.Time
	lastFailure   string
}

// parseSupervisorLog reads a warm pod's job container log, each line prefixed with the
// container runtime's timestamp (PodLogOptions.Timestamps). A restart of the wait (a new
// wait line) forgets the failures before it.
func parseSupervisorLog(log string) supervisorWait {
	var w supervisorWait
	for _, line := range strings.Split(log, "\n") {
		stamp, text, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(text, supervisorWaitLine):
			w = supervisorWait{since: at}
		case strings.Contains(text, supervisorFailLine) && !w.since.IsZero():
			w.failed, w.lastFailure = at, strings.TrimSpace(text)
		}
	}
	return w
}

// asking tells whether the supervisor has been asking for its job for askSettle at now,
// with no attempt failed lately; why it is not, when not.
func (w supervisorWait) asking(now time.Time) (bool, string) {
	switch {
	case w.since.IsZero():
		return false, "its supervisor has not started waiting for a job"
	case !w.failed.IsZero() && now.Sub(w.failed) < retryQuiet:
		return false, fmt.Sprintf("an attempt failed %s ago: %s", now.Sub(w.failed).Round(time.Millisecond), w.lastFailure)
	case now.Sub(w.since) < askSettle:
		return false, fmt.Sprintf("waiting for %s only", now.Sub(w.since).Round(time.Millisecond))
	}
	return true, ""
}

// nodeAsking is how many of the node's warm pods ask agentd for a job now, from their
// supervisors' logs; why the others do not. A pod found asking is not read again while it
// stays idle and running: a wait that fails after the first request ends the supervisor.
func (r *run) nodeAsking(ctx context.Context) (int, []string, error) {
	if r.logs == nil {
		cs, err := kubernetes.NewForConfig(benchREST(r.ce.rest))
		if err != nil {
			return 0, nil, fmt.Errorf("creating the bench's client for pod logs: %w", err)
		}
		r.logs, r.askingPods = cs, map[types.UID]bool{}
	}
	var pods corev1.PodList
	if err := r.c.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{podbuilder.LabelWarmPool: warmEnvironment}); err != nil {
		return 0, nil, fmt.Errorf("listing the warm pods: %w", err)
	}
	n, why := 0, []string(nil)
	now := time.Now()
	for i := range pods.Items {
		pod := &pods.Items[i]
		idle, running := idleWarmPod(pod)
		if !idle {
			continue
		}
		if !running {
			why = append(why, fmt.Sprintf("%s: %s, its job container not running", pod.Name, pod.Status.Phase))
			continue
		}
		if r.askingPods[pod.UID] {
			n++
			continue
		}
		b, err := r.logs.CoreV1().Pods(namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: podcontract.JobContainer, Timestamps: true}).DoRaw(ctx)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: its log: %v", pod.Name, err))
			continue
		}
		if ok, reason := parseSupervisorLog(string(b)).asking(now); !ok {
			why = append(why, pod.Name+": "+reason)
			continue
		}
		r.askingPods[pod.UID] = true
		n++
	}
	return n, why, nil
}

// idleWarmPod tells whether pod is one of the pool's, neither taken by a job nor going, and
// whether its job container, where the supervisor waits, runs.
func idleWarmPod(pod *corev1.Pod) (idle, running bool) {
	owner := metav1.GetControllerOf(pod)
	if _, taken := pod.Labels[bkv1.LabelJob]; taken || !pod.DeletionTimestamp.IsZero() || (owner != nil && owner.Kind == "BuildJob") {
		return false, false
	}
	cs := jobContainerStatus(pod)
	return true, pod.Status.Phase == corev1.PodRunning && cs != nil && cs.State.Running != nil
}

// handoffLine is what the bench reads of a line of agentd's log (JSON, zap's production
// encoder as controller-runtime configures it).
type handoffLine struct {
	Msg string          `json:"msg"`
	TS  json.RawMessage `json:"ts"`
	Job string          `json:"job"`
	// Pod is handoff.PodRef's String: "<namespace>/<name> (uid <uid>)".
	Pod string `json:"pod"`
}

// readHandoffLog is each job agentd handed off to a warm pod, by Buildkite job ID, from its
// log at path.
func readHandoffLog(path string) (map[string]handoffSeen, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening agentd's log: %w", err)
	}
	defer func() { _ = f.Close() }()
	out, err := parseHandoffLog(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// parseHandoffLog keeps each job's first hand-off line with a timestamp the bench can read.
// Lines that are not JSON (a panic's, Go's runtime's) are none of the hand-offs.
func parseHandoffLog(r io.Reader) (map[string]handoffSeen, error) {
	out := map[string]handoffSeen{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 4<<20)
	for sc.Scan() {
		b := sc.Bytes()
		if !json.Valid(b) {
			continue
		}
		var l handoffLine
		if err := json.Unmarshal(b, &l); err != nil || l.Msg != handoff.LogHandedOff || l.Job == "" {
			continue
		}
		at, ok := logTime(l.TS)
		if _, seen := out[l.Job]; seen || !ok {
			continue
		}
		out[l.Job] = handoffSeen{pod: podName(l.Pod), at: at}
	}
	return out, sc.Err()
}

// logTime reads zap's timestamp: a string for the RFC 3339 encoders, a number of seconds
// since the epoch for the epoch encoder.
func logTime(raw json.RawMessage) (time.Time, bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		t, err := time.Parse(time.RFC3339Nano, s)
		return t, err == nil
	}
	var secs float64
	if err := json.Unmarshal(raw, &secs); err == nil && secs > 0 {
		whole, frac := math.Modf(secs)
		return time.Unix(int64(whole), int64(frac*1e9)), true
	}
	return time.Time{}, false
}

// podName is the name in handoff.PodRef's String.
func podName(ref string) string {
	ref, _, _ = strings.Cut(ref, " (")
	_, name, ok := strings.Cut(ref, "/")
	if !ok {
		return ref
	}
	return name
}
