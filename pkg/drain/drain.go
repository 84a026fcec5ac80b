// Package drain is what `agentd drain`, the chart's pre-delete hook, does before the
// operator is uninstalled. Deleting the operator alone would leave running jobs accepted
// on Buildkite with nobody to finish them, and their BuildJobs' finalizers would hold the
// namespace's deletion for ever. So, while the operator still runs:
//
//  1. every BuildJob is marked as stopped for the uninstall (bkv1.AnnotationStopReason),
//     then deleted: the controller stops each job's pod and finishes the job on Buildkite
//     with signal reason agent_stop, as an agent that is stopped does (a step's automatic
//     retry rule for agent_stop retries it on another agent), and an explanation in its log
//     that the operator is being uninstalled; then it lets the BuildJob go, and its slot is
//     idle again;
//  2. the Deployment is rolled to --spawner=false: no new job is taken, and the stopping
//     spawner disconnects its idle agents (a busy slot's agent would be kept for the next
//     leader, which is why the jobs end first);
//  3. a job taken between 1 and 2 is ended the same way; it waits until no BuildJob is
//     left, or its context ends.
package drain

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
)

// Drainer drains one installation of the operator.
type Drainer struct {
	Client client.Client
	// Namespace and Deployment name the operator's Deployment.
	Namespace, Deployment string
	// JobNamespace holds the BuildJobs.
	JobNamespace string
	// Out receives what the drain is doing, for the hook's log; os.Stdout when nil.
	Out io.Writer
}

// pollInterval is how often the drain looks whether what it waits for is done.
const pollInterval = time.Second

// Run ends every BuildJob, turns the spawner off, then ends the BuildJobs taken meanwhile.
// ctx bounds the whole drain (--timeout).
func (d *Drainer) Run(ctx context.Context) error {
	if err := d.endBuildJobs(ctx, d.JobNamespace); err != nil {
		return err
	}
	if err := d.stopSpawner(ctx); err != nil {
		return err
	}
	return d.endBuildJobs(ctx, d.JobNamespace)
}

func (d *Drainer) printf(format string, args ...any) {
	out := d.Out
	if out == nil {
		out = os.Stdout
	}
	_, _ = fmt.Fprintf(out, format, args...)
}

// endBuildJobs marks every BuildJob of the namespace as stopped for the uninstall, deletes
// them all, and waits until the controller has ended each on Buildkite and let it go.
func (d *Drainer) endBuildJobs(ctx context.Context, namespace string) error {
	if err := d.markUninstall(ctx, namespace); err != nil {
		return err
	}
	if err := d.Client.DeleteAllOf(ctx, &bkv1.BuildJob{}, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("deleting the BuildJobs of %s: %w", namespace, err)
	}
	left := 0
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		var list bkv1.BuildJobList
		if err := d.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return false, fmt.Errorf("listing the BuildJobs of %s: %w", namespace, err)
		}
		if left = len(list.Items); left > 0 {
			d.printf("%d BuildJobs are being ended on Buildkite\n", left)
		}
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d BuildJobs of %s to be ended: %w", left, namespace, err)
	}
	d.printf("every BuildJob of %s is ended\n", namespace)
	return nil
}

// markUninstall annotates every BuildJob of the namespace that is not being deleted yet
// with the uninstall as its stop reason, before it is deleted: the controller reads it
// when it works out how the job ended, and says in the job's log that the operator is
// being uninstalled. It is no condition of the drain: a BuildJob made after the list, or
// a drain whose Role may not patch BuildJobs, still has its job ended, with the words of
// any deleted BuildJob.
func (d *Drainer) markUninstall(ctx context.Context, namespace string) error {
	var list bkv1.BuildJobList
	if err := d.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing the BuildJobs of %s: %w", namespace, err)
	}
	for i := range list.Items {
		bj := &list.Items[i]
		if !bj.DeletionTimestamp.IsZero() || bj.Annotations[bkv1.AnnotationStopReason] == bkv1.StopReasonUninstall {
			continue
		}
		patch := client.MergeFrom(bj.DeepCopy())
		if bj.Annotations == nil {
			bj.Annotations = map[string]string{}
		}
		bj.Annotations[bkv1.AnnotationStopReason] = bkv1.StopReasonUninstall
		err := d.Client.Patch(ctx, bj, patch)
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			d.printf("cannot mark the BuildJobs of %s as stopped for the uninstall (%v): their jobs' logs will only say that their BuildJobs were deleted\n", namespace, err)
			return nil
		case err != nil:
			return fmt.Errorf("marking BuildJob %s/%s as stopped for the uninstall: %w", namespace, bj.Name, err)
		}
	}
	return nil
}
