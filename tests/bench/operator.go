package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
)

// barePods is the floor: N pods with the job image and nothing of the operator's, created
// as the run's jobs arrive (all at once, or in the open loop at its rate: pods that start
// one by one are not N starting together); each one's create → running as the watch sees
// it, until the kwok backend's audit log gives it again (serverTimes).
func (r *run) barePods(ctx context.Context) (Stats, error) {
	n := r.cfg.InFlight
	var span time.Duration
	if r.cfg.Rate > 0 {
		span = arrival(n, r.cfg.Rate)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute+span)
	defer cancel()
	errs := make(chan error, n)
	zero := int64(0)
	start := time.Now()
	for i := range n {
		go func() {
			if r.cfg.Rate > 0 {
				select {
				case <-ctx.Done():
					errs <- ctx.Err()
					return
				case <-time.After(time.Until(start.Add(arrival(i, r.cfg.Rate)))):
				}
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: barePodName(i), Namespace: namespace, Labels: map[string]string{bareLabel: "true"}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: &zero,
					Containers: []corev1.Container{{
						Name: "bare", Image: r.ce.jobImage, ImagePullPolicy: r.ce.pullPolicy,
						Command: []string{"sleep", "3600"},
					}},
				},
			}
			errs <- r.c.Create(ctx, pod)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			return Stats{}, fmt.Errorf("creating a bare pod: %w", err)
		}
	}
	err := r.w.waitFor(ctx, "the bare pods to run", func() bool {
		running := 0
		for _, o := range r.w.bare {
			if !o.podRunning.IsZero() {
				running++
			}
		}
		return running == n
	})
	if err != nil {
		return Stats{}, err
	}
	var ds []time.Duration
	r.w.mu.Lock()
	for _, o := range r.w.bare {
		ds = append(ds, o.podRunning.Sub(o.podCreated))
	}
	r.w.mu.Unlock()
	err = r.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(namespace), client.MatchingLabels{bareLabel: "true"}, client.GracePeriodSeconds(0))
	if err != nil {
		return Stats{}, fmt.Errorf("deleting the bare pods: %w", err)
	}
	if err := r.w.waitFor(ctx, "the bare pods to be gone", func() bool { return len(r.w.barePods) == 0 }); err != nil {
		return Stats{}, err
	}
	return percentiles(ds), nil
}

func barePodName(i int) string { return fmt.Sprintf("bare-%d", i) }

// startOperator runs `agentd operator` with InFlight slots and waits for them to connect.
func (r *run) startOperator(ctx context.Context) error {
	var err error
	if r.metricsAddr, err = freeAddr(); err != nil {
		return err
	}
	if r.cfg.Warm {
		if r.webhookPort, err = freePort(); err != nil {
			return err
		}
		if !r.ce.simulated {
			if err := r.serveHandoffToPods(ctx); err != nil {
				return err
			}
		}
	}
	args := append([]string{
		"operator",
		"--namespace", namespace,
		"--agent-endpoint", r.fake.Endpoint(),
		"--registration-token-secret", harness.TokenSecret,
		"--slots", strconv.Itoa(r.cfg.InFlight),
		"--operator-image", r.ce.operatorImage,
		"--default-build-environment", "default",
		"--leader-elect=false",
		"--metrics-bind-address", r.metricsAddr,
		"--health-probe-bind-address", "0",
	}, r.webhookArgs()...)
	args = append(args, r.cfg.OperatorArgs...)
	if r.op, err = startChild("agentd-operator", r.cfg.Dir, r.cfg.Agentd, args, append([]string{"KUBECONFIG=" + r.ce.operatorKubeconfig}, r.cfg.OperatorEnv...)); err != nil {
		return err
	}
	r.cfg.Logf("waiting for the operator's %d slots to connect", r.cfg.InFlight)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute+time.Duration(r.cfg.InFlight)*time.Second)
	defer cancel()
	err = r.fake.WaitFor(wctx, func() bool {
		if !r.op.running() {
			return true
		}
		return r.fake.ConnectedAgents() >= r.cfg.InFlight
	})
	if !r.op.running() {
		return fmt.Errorf("the operator exited before its slots connected; its log ends:\n%s", r.op.tail())
	}
	if err != nil {
		return fmt.Errorf("waiting for the operator's %d slots to connect: %w; its log ends:\n%s", r.cfg.InFlight, err, r.op.tail())
	}
	if r.cfg.Warm {
		return r.waitCertificates(wctx)
	}
	return nil
}
