// Package spawnertest helps test the JobSpawner against a real API server: Reporter
// plays the controller's part at the end of a job's life.
package spawnertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/pkg/agentapi"
	"github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Reporter stands in for the controller: for every BuildJob in Namespace it waits up to
// Hold, finishes the job in Buildkite with the job token from the BuildJob's Secret (exit
// status 0), then sets status.times.reportedAt and the Reported condition, which frees
// the spawner's slot. It records how many BuildJobs were in flight (existing and not yet
// reported) at most.
type Reporter struct {
	Client    client.Client
	Namespace string
	// Hold is the longest a job "runs" before it is finished; each job gets a random
	// time up to it.
	Hold time.Duration

	mu          sync.Mutex
	handled     map[string]bool
	maxInFlight int
	errs        []error
}

// Run reports BuildJobs until ctx ends. It polls: it is a test's stand-in, not the
// controller.
func (r *Reporter) Run(ctx context.Context) {
	r.mu.Lock()
	if r.handled == nil {
		r.handled = map[string]bool{}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var list v1alpha1.BuildJobList
		if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace)); err != nil {
			continue
		}
		inFlight := 0
		for i := range list.Items {
			bj := list.Items[i]
			// As the controller: nothing of Buildkite for a BuildJob made by hand.
			if bj.Status.Times.ReportedAt != nil || v1alpha1.MadeByHand(&bj) {
				continue
			}
			inFlight++
			r.mu.Lock()
			seen := r.handled[bj.Name]
			r.handled[bj.Name] = true
			r.mu.Unlock()
			if seen {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := r.report(ctx, &bj); err != nil && ctx.Err() == nil {
					r.mu.Lock()
					r.errs = append(r.errs, err)
					r.mu.Unlock()
				}
			}()
		}
		r.mu.Lock()
		r.maxInFlight = max(r.maxInFlight, inFlight)
		r.mu.Unlock()
	}
}

func (r *Reporter) report(ctx context.Context, bj *v1alpha1.BuildJob) error {
	if r.Hold > 0 {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rand.N(r.Hold)):
		}
	}
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: bj.Namespace, Name: bj.Spec.TokenSecretRef.Name}
	// The spawner creates the Secret just after the BuildJob.
	for {
		err := r.Client.Get(ctx, key, &sec)
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || ctx.Err() != nil {
			return fmt.Errorf("token Secret of %s: %w", bj.Name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := agentapi.New(agentapi.Config{
		Endpoint:  bj.Spec.AgentEndpoint,
		Token:     string(sec.Data[bj.Spec.TokenSecretRef.Key]),
		WaitScale: 0.01,
	})
	if err := c.Finish(ctx, bj.Spec.JobID, agentapi.Finish{ExitStatus: 0}); err != nil {
		return fmt.Errorf("finishing job %s: %w", bj.Spec.JobID, err)
	}
	for {
		var cur v1alpha1.BuildJob
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(bj), &cur); err != nil {
			return fmt.Errorf("reading %s: %w", bj.Name, err)
		}
		now := metav1.Now()
		cur.Status.Times.ReportedAt = &now
		cur.Status.Phase = v1alpha1.PhaseSucceeded
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionReported, Status: metav1.ConditionTrue, Reason: "Finished", Message: "Buildkite has the job's finish",
		})
		err := r.Client.Status().Update(ctx, &cur)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("reporting %s: %w", bj.Name, err)
		}
	}
}

// MaxInFlight is the most BuildJobs seen existing and not yet reported at once.
func (r *Reporter) MaxInFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxInFlight
}

// Errors are the failures to report a BuildJob.
func (r *Reporter) Errors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}
