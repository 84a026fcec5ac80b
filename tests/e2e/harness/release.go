package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// ReleaseName is the Helm release the harness installs; the chart's names derive from it
// (Deployment, ServiceAccount, leader election Lease: "buildkite-operator").
const ReleaseName = "buildkite-operator"

// Release is the operator installed into the cluster by its Helm chart, as a platform team
// installs it: its image, its RBAC, two replicas with leader election, webhooks and
// authenticated metrics on.
type Release struct {
	// Name is the Helm release's name; ReleaseName when empty.
	Name string
	// Chart is the chart and the arguments that locate it (an OCI reference with --version
	// and --plain-http, say); the repository's chart folder when empty.
	Chart      []string
	Namespace  string
	Kubeconfig string
	// Values are the --set style arguments the release is installed and upgraded with.
	Values []string
	// AfterApply, when set, runs after every install and upgrade: helm puts back what the
	// chart says, such as the job namespace's labels.
	AfterApply func(context.Context) error
	cs         kubernetes.Interface
}

// NewRelease is another release of the chart in e's cluster: name in namespace, installed
// with values.
func (e *Env) NewRelease(name, namespace string, values []string) (*Release, error) {
	cs, err := kubernetes.NewForConfig(e.REST)
	if err != nil {
		return nil, fmt.Errorf("creating a clientset: %w", err)
	}
	return &Release{Name: name, Namespace: namespace, Kubeconfig: e.Kubeconfig, Values: values, cs: cs}, nil
}

func (r *Release) name() string {
	if r.Name == "" {
		return ReleaseName
	}
	return r.Name
}

func (r *Release) chart() []string {
	if len(r.Chart) == 0 {
		return []string{helmchart.ChartDir()}
	}
	return r.Chart
}

// FullName is the name the chart gives the release's objects (its Deployment, its leader
// election Lease): the release's name, prefixed to the chart's unless it holds it.
func (r *Release) FullName() string {
	if strings.Contains(r.name(), "buildkite-operator") {
		return r.name()
	}
	return r.name() + "-buildkite-operator"
}

// helm runs the helm CLI against the release's cluster.
func (r *Release) helm(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, helmchart.HelmBinary(), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+r.Kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

// Install installs the chart and waits until every replica is ready.
func (r *Release) Install(ctx context.Context) error {
	args := append(append([]string{"install", r.name()}, r.chart()...), "--namespace", r.Namespace, "--wait", "--timeout", "4m")
	args = append(args, r.Values...)
	return r.applied(ctx, r.helm(ctx, args...))
}

func (r *Release) applied(ctx context.Context, err error) error {
	if err != nil || r.AfterApply == nil {
		return err
	}
	return r.AfterApply(ctx)
}

// Upgrade upgrades the release with extra values on top of its own, and waits for the
// rollout.
func (r *Release) Upgrade(ctx context.Context, extra ...string) error {
	args := append(append([]string{"upgrade", r.name()}, r.chart()...), "--namespace", r.Namespace, "--wait", "--timeout", "4m")
	args = append(args, r.Values...)
	return r.applied(ctx, r.helm(ctx, append(args, extra...)...))
}

// Uninstall removes the release (not the CRDs, which Helm keeps) and waits for it.
func (r *Release) Uninstall(ctx context.Context) error {
	return r.helm(ctx, "uninstall", r.name(), "--namespace", r.Namespace, "--wait", "--timeout", "2m")
}

// Pods are the operator's pods, oldest first.
func (r *Release) Pods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := r.cs.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + r.name() + ",app.kubernetes.io/component=operator",
	})
	if err != nil {
		return nil, fmt.Errorf("listing the operator's pods: %w", err)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		return list.Items[i].CreationTimestamp.Before(&list.Items[j].CreationTimestamp)
	})
	return list.Items, nil
}

// Leader is the pod holding the leader election Lease, with the Lease's last renewal.
func (r *Release) Leader(ctx context.Context) (string, error) {
	var lease *coordinationv1.Lease
	lease, err := r.cs.CoordinationV1().Leases(r.Namespace).Get(ctx, r.FullName(), metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the leader election Lease: %w", err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	// controller-runtime names the holder <pod name>_<uuid>.
	name, _, _ := strings.Cut(holder, "_")
	return name, nil
}

// KillLeader deletes the leader's pod at once (grace period 0, as `kubectl delete
// --grace-period=0 --force`): a crash of the node or the process, with no goodbye. It
// returns the pod it killed.
func (r *Release) KillLeader(ctx context.Context) (string, error) {
	leader, err := r.Leader(ctx)
	if err != nil {
		return "", err
	}
	if leader == "" {
		return "", fmt.Errorf("the Lease %s/%s has no holder", r.Namespace, r.FullName())
	}
	if err := r.cs.CoreV1().Pods(r.Namespace).Delete(ctx, leader, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		return "", fmt.Errorf("deleting the leader pod %s: %w", leader, err)
	}
	return leader, nil
}

// WaitNewLeader waits until a pod other than old holds the Lease, and returns it.
func (r *Release) WaitNewLeader(ctx context.Context, old string) (string, error) {
	for {
		if l, err := r.Leader(ctx); err == nil && l != "" && l != old {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no new leader after %s: %w", old, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Running: at least one operator pod is running.
func (r *Release) Running() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pods, err := r.Pods(ctx)
	if err != nil {
		return true // unknown: let the caller's own timeout decide
	}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning {
			return true
		}
	}
	return false
}

// Tail is the last n lines of each operator pod's log.
func (r *Release) Tail(n int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := r.Pods(ctx)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "--- pod %s (%s)\n", p.Name, p.Status.Phase)
		rc, err := r.cs.CoreV1().Pods(r.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptr.To(int64(n))}).Stream(ctx)
		if err != nil {
			fmt.Fprintf(&b, "(no log: %v)\n", err)
			continue
		}
		data, _ := io.ReadAll(rc)
		_ = rc.Close()
		b.Write(data)
	}
	return b.String()
}

// LogHint says how to read the operator's logs.
func (r *Release) LogHint() string {
	return fmt.Sprintf("kubectl -n %s logs -l app.kubernetes.io/instance=%s --tail=-1", r.Namespace, r.name())
}
