package buildjob

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// A reported BuildJob is kept for its retention (an hour by default) so that a person can
// look at it; at a high job rate that is tens of thousands of BuildJobs and their token
// Secrets in etcd and in the operator's cache. Past Options.MaxRetainedBuildJobs the
// longest reported go first, as the kube-controller-manager's pod garbage collector does
// with terminated pods past --terminated-pod-gc-threshold: what they cost is then bounded
// by the cap, whatever the rate.

// retainedSweepMax is the longest time between two counts of the reported BuildJobs: at
// 20 jobs a second the cap is overshot by 200 at most.
const retainedSweepMax = 10 * time.Second

// capRetained counts the reported BuildJobs every sweep interval, and deletes the longest
// reported beyond the cap, until ctx ends. It runs while this process leads.
func (r *Reconciler) capRetained(ctx context.Context) error {
	t := time.NewTicker(min(retainedSweepMax, r.opts.ResyncInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := r.deleteBeyondCap(ctx); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "cannot keep the reported BuildJobs under the cap; trying again later",
				"maxRetainedBuildJobs", r.opts.MaxRetainedBuildJobs)
		}
	}
}

// deleteBeyondCap deletes the reported BuildJobs beyond the cap, the longest reported first
// (names break ties: reportedAt has whole seconds). A BuildJob whose job is not reported is
// never counted, nor deleted.
func (r *Reconciler) deleteBeyondCap(ctx context.Context) error {
	var list bkv1.BuildJobList
	// Read only: the cache's objects are not copied, and not written back.
	if err := r.client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing BuildJobs: %w", err)
	}
	var kept []*bkv1.BuildJob
	for i := range list.Items {
		if job := &list.Items[i]; reported(job) && job.DeletionTimestamp.IsZero() {
			kept = append(kept, job)
		}
	}
	excess := len(kept) - r.opts.MaxRetainedBuildJobs
	if excess <= 0 {
		return nil
	}
	slices.SortFunc(kept, func(a, b *bkv1.BuildJob) int {
		return cmp.Or(a.Status.Times.ReportedAt.Compare(b.Status.Times.ReportedAt.Time),
			strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	for _, job := range kept[:excess] {
		victim := &bkv1.BuildJob{ObjectMeta: metav1.ObjectMeta{Namespace: job.Namespace, Name: job.Name}}
		if err := r.client.Delete(ctx, victim, client.Preconditions{UID: &job.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting BuildJob %s/%s beyond the cap of %d reported BuildJobs: %w",
				job.Namespace, job.Name, r.opts.MaxRetainedBuildJobs, err)
		}
	}
	log.FromContext(ctx).V(1).Info("deleted reported BuildJobs beyond the cap before their retention",
		"deleted", excess, "maxRetainedBuildJobs", r.opts.MaxRetainedBuildJobs)
	return nil
}
