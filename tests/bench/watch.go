package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
)

// bareLabel marks the bench's bare pods, which no operator owns.
const bareLabel = "bench.buildkite-operator.dev/bare"

// watcher records when the bench sees each BuildJob and pod appear and each pod run. Object
// timestamps (creationTimestamp, condition times) are whole seconds, too coarse for the
// sub-second phases measured here, so the moments are the watch's, on the same clock as
// the fake's records.
type watcher struct {
	// onPod, when set, sees every pod the watch reports (the stand-in supervisor), and
	// onGone every pod deleted.
	onPod, onGone func(*corev1.Pod)

	mu   sync.Mutex
	jobs map[string]*observed // by Buildkite job ID
	bare map[string]*observed // by pod name: podCreated and podRunning
	// jobPods and barePods are the pods that exist, by name; buildJobs the BuildJobs.
	jobPods, barePods, buildJobs map[string]bool
	// warmPods are the warm pods that exist, by name: true once assigned to a BuildJob.
	warmPods map[string]bool
	changed  chan struct{}
}

// watch starts watching the namespace's pods and BuildJobs until ctx ends.
func watch(ctx context.Context, cfg *rest.Config, namespace string, onPod, onGone func(*corev1.Pod)) (*watcher, error) {
	w := &watcher{
		onPod: onPod, onGone: onGone, jobs: map[string]*observed{}, bare: map[string]*observed{},
		jobPods: map[string]bool{}, barePods: map[string]bool{}, buildJobs: map[string]bool{}, warmPods: map[string]bool{},
		changed: make(chan struct{}),
	}
	c, err := cache.New(cfg, cache.Options{Scheme: harness.Scheme(), DefaultNamespaces: map[string]cache.Config{namespace: {}}})
	if err != nil {
		return nil, fmt.Errorf("creating the bench's watch: %w", err)
	}
	pods, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	if _, err := pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    w.pod,
		UpdateFunc: func(_, obj any) { w.pod(obj) },
		DeleteFunc: w.podDeleted,
	}); err != nil {
		return nil, err
	}
	jobs, err := c.GetInformer(ctx, &bkv1.BuildJob{})
	if err != nil {
		return nil, fmt.Errorf("watching BuildJobs: %w", err)
	}
	if _, err := jobs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: w.buildJob, DeleteFunc: w.buildJobDeleted}); err != nil {
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the bench's watch did not sync: %w", ctx.Err())
	}
	return w, nil
}

// jobIDOf is the Buildkite job a pod runs, from its job container's env.
func jobIDOf(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		if c.Name != podcontract.JobContainer {
			continue
		}
		for _, e := range c.Env {
			if e.Name == podcontract.EnvJobID {
				return e.Value
			}
		}
	}
	return ""
}

// entry is the record of key in m, made on first use. Call with w.mu held.
func entry(m map[string]*observed, key string) *observed {
	o := m[key]
	if o == nil {
		o = &observed{}
		m[key] = o
	}
	return o
}

func setOnce(t *time.Time, now time.Time) {
	if t.IsZero() {
		*t = now
	}
}

func (w *watcher) pod(obj any) {
	now := time.Now()
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	var o *observed
	switch id := jobIDOf(pod); {
	case pod.Labels[bareLabel] != "":
		o = entry(w.bare, pod.Name)
		w.barePods[pod.Name] = true
	case id != "":
		o = entry(w.jobs, id)
		o.podName = pod.Name
		w.jobPods[pod.Name] = true
	case pod.Labels[podbuilder.LabelWarmPool] != "":
		owner := metav1.GetControllerOf(pod)
		w.warmPods[pod.Name] = owner != nil && owner.Kind == "BuildJob"
	}
	if o != nil {
		setOnce(&o.podCreated, now)
		if pod.Status.Phase == corev1.PodRunning {
			setOnce(&o.podRunning, now)
		}
	}
	w.notifyLocked()
	w.mu.Unlock()
	if w.onPod != nil {
		w.onPod(pod)
	}
}

func (w *watcher) podDeleted(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	delete(w.jobPods, pod.Name)
	delete(w.barePods, pod.Name)
	delete(w.warmPods, pod.Name)
	w.notifyLocked()
	w.mu.Unlock()
	if w.onGone != nil {
		w.onGone(pod)
	}
}

func (w *watcher) buildJob(obj any) {
	now := time.Now()
	bj, ok := obj.(*bkv1.BuildJob)
	if !ok || bj.Spec.JobID == "" {
		return
	}
	w.mu.Lock()
	o := entry(w.jobs, bj.Spec.JobID)
	setOnce(&o.buildJob, now)
	o.buildJobName = bj.Name
	w.buildJobs[bj.Name] = true
	w.notifyLocked()
	w.mu.Unlock()
}

func (w *watcher) buildJobDeleted(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	bj, ok := obj.(*bkv1.BuildJob)
	if !ok {
		return
	}
	w.mu.Lock()
	delete(w.buildJobs, bj.Name)
	w.notifyLocked()
	w.mu.Unlock()
}

// counts are the BuildJobs and job pods that exist now.
func (w *watcher) counts() (buildJobs, jobPods int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.buildJobs), len(w.jobPods)
}

func (w *watcher) notifyLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// waitFor waits until cond (called with w.mu held) holds, or ctx ends.
func (w *watcher) waitFor(ctx context.Context, what string, cond func() bool) error {
	for {
		w.mu.Lock()
		ok, ch := cond(), w.changed
		w.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-ch:
		}
	}
}

// jobsSeen is a copy of what the watch saw of each job.
func (w *watcher) jobsSeen() map[string]observed {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]observed, len(w.jobs))
	for k, v := range w.jobs {
		out[k] = *v
	}
	return out
}
