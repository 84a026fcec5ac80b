package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/buildkite-operator/buildkite-operator/tests/auditlog"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testenv"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// KwokVersion is the kwok release tests/tools/kwok pins and `make kwok` builds.
const KwokVersion = "v0.8.0"

// KwokBinary is the kwok command: $KWOK when set (the Makefile sets it), else the one
// `make kwok` builds into .cache/tools.
func KwokBinary() string {
	if p := os.Getenv("KWOK"); p != "" {
		return p
	}
	return filepath.Join(testkit.RepoRoot(), ".cache", "tools", "kwok-"+KwokVersion)
}

// kwokNode is the one simulated node: every pod lands on it, as many as the bench makes.
const kwokNode = "kwok-node-0"

// kwokConfig tells kwok how the simulated node and its pods behave, in place of its
// default stages: the node becomes Ready; a pod on it starts at once as the kubelet
// reports a pod whose init containers ran and whose containers run; a deleted pod is
// removed once nothing (such as the operator's finalizer) holds it. No stage ends a pod:
// the stand-in supervisor does, with the termination message the controller reads.
//
// The file holds no KwokConfiguration: kwok's defaults are applied only to one it makes.
const kwokConfig = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: bench-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - type: {{ .type | Quote }}
        status: {{ .status | Quote }}
        reason: {{ .reason | Quote }}
        message: {{ .message | Quote }}
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: bench-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - type: PodReadyToStartContainers
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: Initialized
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: Ready
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: ContainersReady
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: PodScheduled
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: bench-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
`

// startKwok starts a real kube-apiserver and etcd (envtest, with an audit log),
// kube-scheduler, kube-controller-manager's garbage collector, and kwok with one simulated
// node.
func startKwok(ctx context.Context, cfg *Config) (_ *clusterEnv, err error) {
	for _, bin := range []struct{ path, how string }{
		{cfg.Kwok, "make kwok"},
		{cfg.KubeScheduler, "make cluster-binaries"},
		{cfg.KubeControllerManager, "make cluster-binaries"},
	} {
		if _, err := os.Stat(bin.path); err != nil {
			return nil, fmt.Errorf("%s: %w (build it with `%s`)", bin.path, err, bin.how)
		}
	}
	auditLog := filepath.Join(cfg.Dir, "audit.log")
	env, err := startAuditedAPIServer(cfg.Dir, auditLog)
	if err != nil {
		return nil, err
	}
	ce := &clusterEnv{
		rest:          rest.CopyConfig(env.Config),
		auditLog:      auditLog,
		fakeAddr:      "127.0.0.1:0",
		jobImage:      images.JobImage,
		pullPolicy:    corev1.PullIfNotPresent,
		operatorImage: images.AgentdImage,
		simulated:     true,
		limits:        kwokLimits(),
	}
	var children []*child
	ce.stop = func(context.Context) error {
		var errs []error
		for i := len(children) - 1; i >= 0; i-- {
			errs = append(errs, children[i].stop(10*time.Second))
		}
		return errors.Join(append(errs, env.Stop())...)
	}
	defer func() {
		if err != nil {
			_ = ce.stop(ctx)
		}
	}()
	if ce.operatorKubeconfig, err = userKubeconfig(env, cfg.Dir, operatorClient); err != nil {
		return ce, err
	}
	if children, err = startKwokComponents(cfg, env); err != nil {
		return ce, err
	}
	if err := addKwokNode(ctx, env.Client); err != nil {
		for _, c := range children {
			if !c.running() {
				err = fmt.Errorf("%w; %s exited, its log ends:\n%s", err, c.name, c.tail())
			}
		}
		return ce, err
	}
	return ce, nil
}

// startAuditedAPIServer starts envtest's etcd and kube-apiserver, the API server writing
// an audit log to auditLog.
func startAuditedAPIServer(dir, auditLog string) (*testenv.Env, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditlog.Policy), 0o644); err != nil {
		return nil, fmt.Errorf("writing the audit policy: %w", err)
	}
	return testenv.Start(func(te *envtest.Environment) {
		te.ControlPlane.GetAPIServer().Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", auditLog).
			Set("audit-log-format", "json")
	})
}

// userKubeconfig writes a kubeconfig for an API server user of its own for component
// name, so that the audit log tells the components apart by user as well as by user agent.
func userKubeconfig(env *testenv.Env, dir, name string) (string, error) {
	u, err := env.AddUser(envtest.User{Name: userPrefix + name, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("adding the API server user for %s: %w", name, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".kubeconfig")
	return path, os.WriteFile(path, b, 0o600)
}

// startKwokComponents starts kube-scheduler, the garbage collector and kwok; what it
// returns is running, even with an error, and is for the caller to stop.
func startKwokComponents(cfg *Config, env *testenv.Env) ([]*child, error) {
	var children []*child
	sched, err := userKubeconfig(env, cfg.Dir, "kube-scheduler")
	if err != nil {
		return children, err
	}
	c, err := startScheduler(cfg, sched)
	if err != nil {
		return children, err
	}
	children = append(children, c)
	if c, err = startGarbageCollector(cfg, env); err != nil {
		return children, err
	}
	children = append(children, c)

	kw, err := userKubeconfig(env, cfg.Dir, "kwok")
	if err != nil {
		return children, err
	}
	conf := filepath.Join(cfg.Dir, "kwok.yaml")
	if err := os.WriteFile(conf, []byte(kwokConfig), 0o644); err != nil {
		return children, fmt.Errorf("writing kwok's configuration: %w", err)
	}
	c, err = startChild("kwok", cfg.Dir, cfg.Kwok, []string{
		"--kubeconfig=" + kw, "--config=" + conf,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		// Room for every pod of the largest run: pod IPs are not reused at once.
		"--cidr=10.64.0.0/14", "--node-ip=10.63.0.1",
	}, []string{"HOME=" + cfg.Dir}) // kwok also reads ~/.kwok/kwok.yaml: not the user's
	if err != nil {
		return children, err
	}
	return append(children, c), nil
}

// startGarbageCollector runs kube-controller-manager with its garbage collector alone, as
// every cluster has it: the token Secret of a BuildJob the operator deletes (after its
// retention, or beyond the cap on those kept) is the collector's to delete, through its
// owner reference. Without it the retention run would count Secrets no cluster keeps.
func startGarbageCollector(cfg *Config, env *testenv.Env) (*child, error) {
	kc, err := userKubeconfig(env, cfg.Dir, "kube-controller-manager")
	if err != nil {
		return nil, err
	}
	return startChild("kube-controller-manager", cfg.Dir, cfg.KubeControllerManager, []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--controllers=garbagecollector", "--leader-elect=false", "--secure-port=0",
	}, nil)
}

// addKwokNode creates the simulated node and waits until kwok has made it Ready.
func addKwokNode(ctx context.Context, c client.Client) error {
	lots := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1000"),
		corev1.ResourceMemory: resource.MustParse("4Ti"),
		corev1.ResourcePods:   resource.MustParse("100000"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        kwokNode,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{
				"kubernetes.io/hostname": kwokNode, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok",
			},
		},
		Status: corev1.NodeStatus{Capacity: lots, Allocatable: lots},
	}
	if err := c.Create(ctx, node); err != nil {
		return fmt.Errorf("creating the simulated node: %w", err)
	}
	// The status is the kubelet's: a create leaves it out, so it is written separately.
	node.Status = corev1.NodeStatus{Capacity: lots, Allocatable: lots}
	if err := c.Status().Update(ctx, node); err != nil {
		return fmt.Errorf("setting the simulated node's capacity: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: kwokNode}, &n); err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				// The API server taints a new node not-ready; the node lifecycle
				// controller (in kube-controller-manager, which does not run here) lifts
				// the taint once the node is Ready.
				n.Spec.Taints = nil
				if err := c.Update(ctx, &n); err != nil {
					return fmt.Errorf("lifting the not-ready taint of the simulated node: %w", err)
				}
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kwok did not make node %s Ready within a minute", kwokNode)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
