package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/jobprogress"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
)

// standInOutput is the log the stand-in's command writes.
const standInOutput = "bench: the command ran on a simulated node\n"

// standIn plays the in-pod supervisor on simulated nodes, where no container runs: once a
// job pod runs, it makes the calls `agentd supervise` makes with the job token (job
// state, start, one log chunk, and finish when the pod's supervisor is told to finish the
// job itself, podcontract.FinishFlushedFlag; otherwise the controller sends it once the
// pod has ended), then ends the pod as the kubelet would after the supervisor exits 0: phase
// Succeeded, the job container terminated with exit code 0, reason Completed and the
// supervisor's progress record as its termination message.
//
// A warm pod's supervisor first waits for its job at the operator's hand-off endpoint
// (runWarm): the stand-in then plays the kubelet too, minting the pod's projected token and
// copying its CA bundle as the pod's hand-off volume says, and asks agentd's real endpoint
// with the supervisor's client, handoffclient.
type standIn struct {
	ctx             context.Context
	c               client.Client
	commandDuration time.Duration
	// dir holds what the kubelet would project into warm pods: their tokens and CA bundles.
	dir string

	mu      sync.Mutex
	handled map[types.UID]bool
	// warm are the warm pods whose supervisor the stand-in plays, by UID.
	warm map[types.UID]*warmPod
	// handoffs are the jobs handed off to warm pods, by Buildkite job ID.
	handoffs map[string]handoffSeen
	errs     []error
	wg       sync.WaitGroup
}

// warmPod is the stand-in's record of a warm pod's supervisor.
type warmPod struct {
	name string
	// stop ends its wait for a job: the pod is going.
	stop context.CancelFunc
	// asking is when it began asking for its job; handedOff when it received it.
	asking, handedOff time.Time
	// failed is when an attempt last failed, and why.
	failed     time.Time
	lastFailed string
	// gone: the pod is being deleted; gaveUp: its wait for a job ended without one.
	gone, gaveUp bool
}

// handoffSeen is a job's hand-off as the stand-in saw it: which pod took it, and when.
type handoffSeen struct {
	pod string
	at  time.Time
}

func newStandIn(ctx context.Context, c client.Client, commandDuration time.Duration, dir string) *standIn {
	return &standIn{
		ctx: ctx, c: c, commandDuration: commandDuration, dir: dir,
		handled: map[types.UID]bool{}, warm: map[types.UID]*warmPod{}, handoffs: map[string]handoffSeen{},
	}
}

// onPod runs the job of a job pod the first time the watch shows its job container
// running; for a warm pod it starts waiting for the pod's job.
func (s *standIn) onPod(pod *corev1.Pod) {
	if pod.Labels[podbuilder.LabelWarmPool] != "" && !pod.DeletionTimestamp.IsZero() {
		s.onPodGone(pod)
		return
	}
	if pod.Status.Phase != corev1.PodRunning || !pod.DeletionTimestamp.IsZero() {
		return
	}
	warm := pod.Labels[podbuilder.LabelWarmPool] != ""
	if !warm && jobIDOf(pod) == "" {
		return
	}
	cs := jobContainerStatus(pod)
	if cs == nil || cs.State.Running == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handled[pod.UID] {
		return
	}
	s.handled[pod.UID] = true
	pod = pod.DeepCopy()
	run := func() error { return s.run(pod) }
	if warm {
		ctx, stop := context.WithCancel(s.ctx)
		s.warm[pod.UID] = &warmPod{name: pod.Name, stop: stop}
		run = func() error {
			defer stop()
			return s.runWarm(ctx, pod)
		}
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := run(); err != nil && s.ctx.Err() == nil {
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("pod %s: %w", pod.Name, err))
			s.mu.Unlock()
		}
	}()
}

// onPodGone ends the wait of a warm pod that is being deleted before it got a job, as the
// kubelet's SIGTERM ends its supervisor's.
func (s *standIn) onPodGone(pod *corev1.Pod) {
	if pod.Labels[podbuilder.LabelWarmPool] == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.warm[pod.UID]
	if w == nil {
		// Not started yet: it never will be.
		s.handled[pod.UID] = true
		return
	}
	w.gone = true
	if w.handedOff.IsZero() {
		w.stop()
	}
}

// failed is what went wrong so far in the jobs the stand-in ran, without waiting for the
// others: a job whose supervisor failed never finishes.
func (s *standIn) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// wait waits for the jobs under way and returns what went wrong in any of them.
func (s *standIn) wait() error {
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// finishesItself: the pod's supervisor is told to finish the job on Buildkite itself.
func finishesItself(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if c.Name != podcontract.JobContainer {
			continue
		}
		for _, a := range append(append([]string{}, c.Command...), c.Args...) {
			if a == "--"+podcontract.FinishFlushedFlag {
				return true
			}
		}
	}
	return false
}

func jobContainerStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == podcontract.JobContainer {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// jobEnv is the job container's env as the kubelet would give it: the token from its Secret.
func (s *standIn) jobEnv(pod *corev1.Pod) (map[string]string, error) {
	env := map[string]string{}
	for _, c := range pod.Spec.Containers {
		if c.Name != podcontract.JobContainer {
			continue
		}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				env[e.Name] = e.Value
			case e.Name == podcontract.EnvAccessToken && e.ValueFrom.SecretKeyRef != nil:
				ref := e.ValueFrom.SecretKeyRef
				var sec corev1.Secret
				if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &sec); err != nil {
					return nil, fmt.Errorf("reading the job token: %w", err)
				}
				env[e.Name] = string(sec.Data[ref.Key])
			}
		}
	}
	return env, nil
}

func (s *standIn) run(pod *corev1.Pod) error {
	env, err := s.jobEnv(pod)
	if err != nil {
		return err
	}
	return s.runJob(pod, env, true)
}

// runJob runs the job of pod with the job container's env, as the kubelet gives it or as a
// warm pod's supervisor makes it from its hand-off; current: pod is as the kubelet knows it.
func (s *standIn) runJob(pod *corev1.Pod, env map[string]string, current bool) error {
	jobID := env[podcontract.EnvJobID]
	bk := agentapi.New(agentapi.Config{Endpoint: env[podcontract.EnvEndpoint], Token: env[podcontract.EnvAccessToken], UserAgent: "bench-supervisor"})
	state, err := bk.JobState(s.ctx, jobID)
	if err != nil {
		return err
	}
	if state.Stopped() {
		return fmt.Errorf("job %s is %s on Buildkite before its command started", jobID, state)
	}
	if err := bk.Start(s.ctx, jobID, time.Now()); err != nil {
		return err
	}
	select {
	case <-time.After(s.commandDuration):
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
	if err := bk.UploadChunk(s.ctx, jobID, 1, 0, []byte(standInOutput)); err != nil {
		return err
	}
	progress := jobprogress.Progress{
		Started: true, Sequence: 1, Offset: uint64(len(standInOutput)),
		Exited: true, ExitStatus: 0, Flushed: true,
	}
	if finishesItself(pod) {
		if err := bk.Finish(s.ctx, jobID, agentapi.Finish{ExitStatus: 0}); err != nil {
			return err
		}
		progress.Finished = true
	}
	msg, err := progress.Encode()
	if err != nil {
		return err
	}
	return s.terminate(pod, string(msg), current)
}

// terminate ends the pod as the kubelet reports a pod whose only container exited 0.
func (s *standIn) terminate(pod *corev1.Pod, message string, current bool) error {
	// As the kubelet, from the pod it knows (when current); read again when it changed meanwhile.
	var cur *corev1.Pod
	if current {
		cur = pod.DeepCopy()
	}
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if cur == nil {
			cur = &corev1.Pod{}
			if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(pod), cur); err != nil {
				return err
			}
		}
		defer func() { cur = nil }()
		now := metav1.Now()
		cs := jobContainerStatus(cur)
		if cs == nil || cs.State.Running == nil {
			return fmt.Errorf("its job container is not running: %+v", cur.Status.ContainerStatuses)
		}
		started := false
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", Message: message,
			StartedAt: cs.State.Running.StartedAt, FinishedAt: now,
		}}
		cs.Ready, cs.Started = false, &started
		for i := range cur.Status.Conditions {
			c := &cur.Status.Conditions[i]
			if c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
				c.Status, c.Reason, c.LastTransitionTime = corev1.ConditionFalse, "PodCompleted", now
			}
		}
		cur.Status.Phase = corev1.PodSucceeded
		return s.c.Status().Update(s.ctx, cur)
	})
}
