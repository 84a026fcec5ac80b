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
type standIn struct {
	ctx             context.Context
	c               client.Client
	commandDuration time.Duration

	mu      sync.Mutex
	handled map[types.UID]bool
	errs    []error
	wg      sync.WaitGroup
}

func newStandIn(ctx context.Context, c client.Client, commandDuration time.Duration) *standIn {
	return &standIn{ctx: ctx, c: c, commandDuration: commandDuration, handled: map[types.UID]bool{}}
}

// onPod runs the job of a job pod the first time the watch shows its job container running.
func (s *standIn) onPod(pod *corev1.Pod) {
	if pod.Status.Phase != corev1.PodRunning || !pod.DeletionTimestamp.IsZero() || jobIDOf(pod) == "" {
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
	s.wg.Add(1)
	pod = pod.DeepCopy()
	go func() {
		defer s.wg.Done()
		if err := s.run(pod); err != nil && s.ctx.Err() == nil {
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("pod %s: %w", pod.Name, err))
			s.mu.Unlock()
		}
	}()
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
	return s.terminate(pod, string(msg))
}

// terminate ends the pod as the kubelet reports a pod whose only container exited 0.
func (s *standIn) terminate(pod *corev1.Pod, message string) error {
	// As the kubelet, from the pod it knows; read again only when it changed meanwhile.
	cur := pod.DeepCopy()
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
