package spawner

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubeReach tracks whether the Kubernetes API server answers, for all slots at once: one
// slot that waited CreateTimeout for it is enough for the others not to wait again.
type kubeReach struct {
	mu        sync.Mutex
	downSince time.Time // zero while the API server answers
}

// failed records an error from the API server; only one that another try could cure (no
// answer, 5xx, 429, timeouts) says it is unreachable.
func (k *kubeReach) failed(err error) {
	if err == nil || isPermanent(err) {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.downSince.IsZero() {
		k.downSince = time.Now()
	}
}

// ok records an answer.
func (k *kubeReach) ok() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.downSince = time.Time{}
}

// downFor is how long the API server has been unreachable (0 while it answers).
func (k *kubeReach) downFor() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.downSince.IsZero() {
		return 0
	}
	return time.Since(k.downSince)
}

// kubeGivenUp reports whether the API server has been unreachable for CreateTimeout. Then
// idle slots stop asking Buildkite for jobs, which could only be failed: the jobs wait in
// Buildkite's queue for other agents, or for this operator once its cluster answers.
func (s *Spawner) kubeGivenUp() bool {
	given := s.reach.downFor() >= s.cfg.CreateTimeout
	s.mu.Lock()
	defer s.mu.Unlock()
	if given != s.announcedDown {
		s.announcedDown = given
		if given {
			s.log.Info("the Kubernetes API server has been unreachable for longer than the create timeout: slots take no jobs until it answers", "createTimeout", s.cfg.CreateTimeout)
		} else {
			s.log.Info("the Kubernetes API server answers again: slots take jobs")
		}
	}
	return given
}

// probeKube asks the API server for the slot's state Secret, and waits a little when it
// does not answer.
func (s *Spawner) probeKube(ctx context.Context, index int) {
	if !s.kubeAnswers(ctx, index) {
		sleep(ctx, stateRetry)
	}
}

// kubeAnswers asks the API server for the state Secret of slot index, and tells whether it
// answered.
func (s *Spawner) kubeAnswers(ctx context.Context, index int) bool {
	key := client.ObjectKey{Namespace: s.cfg.Namespace, Name: SlotSecretName(s.cfg.Name, index)}
	err := s.r.Get(ctx, key, &corev1.Secret{})
	if err == nil || isPermanent(err) { // NotFound is an answer too
		s.reach.ok()
		return true
	}
	s.reach.failed(err)
	return false
}
