package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
)

func init() {
	register(command{"drain", "before an uninstall: stop taking jobs, end the running ones on Buildkite, wait until none are left", runDrain})
}

// drainConfig is what `agentd drain` is told.
type drainConfig struct {
	namespaces
	deployment string
	timeout    time.Duration
	kubeconfig string
}

// runDrain is the chart's pre-delete hook. Deleting the operator alone would leave running
// jobs accepted on Buildkite with nobody to finish them, and their BuildJobs' finalizers
// would hold the namespace's deletion for ever. So, while the operator still runs:
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
//     left, or --timeout.
func runDrain(args []string) error {
	var c drainConfig
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	flagenv.String(fs, &c.namespace, "namespace", "BK_OPERATOR_NAMESPACE", DefaultNamespace, "namespace of the operator's Deployment")
	flagenv.String(fs, &c.jobNamespace, "job-namespace", "BK_OPERATOR_JOB_NAMESPACE", "", "namespace of the BuildJobs; -namespace when empty")
	flagenv.String(fs, &c.deployment, "deployment", "BK_OPERATOR_DEPLOYMENT", "buildkite-operator", "the operator's Deployment")
	flagenv.Duration(fs, &c.timeout, "timeout", "BK_OPERATOR_DRAIN_TIMEOUT", 2*time.Minute, "how long to wait for the running jobs to be ended")
	flagenv.String(fs, &c.kubeconfig, "kubeconfig", "KUBECONFIG", "", "kubeconfig file; in-cluster config when empty")
	fs.Usage = flagenv.Usage(fs, "agentd drain [flags]")
	if err := flagenv.Parse(fs, args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cl, err := drainClient(c.kubeconfig)
	if err != nil {
		return err
	}
	jobNS := c.jobNS()
	if err := endBuildJobs(ctx, cl, jobNS); err != nil {
		return err
	}
	if err := stopSpawner(ctx, cl, c.namespace, c.deployment); err != nil {
		return err
	}
	return endBuildJobs(ctx, cl, jobNS)
}

func drainClient(kubeconfig string) (client.Client, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating a client: %w", err)
	}
	return cl, nil
}

// stopSpawner rolls the operator's Deployment to --spawner=false and waits for the rollout.
func stopSpawner(ctx context.Context, cl client.Client, namespace, name string) error {
	var d appsv1.Deployment
	key := types.NamespacedName{Namespace: namespace, Name: name}
	if err := cl.Get(ctx, key, &d); err != nil {
		if apierrors.IsNotFound(err) {
			fmt.Printf("no Deployment %s: nothing takes jobs\n", key)
			return nil
		}
		return fmt.Errorf("reading Deployment %s: %w", key, err)
	}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return fmt.Errorf("deployment %s has no container", key)
	}
	args := d.Spec.Template.Spec.Containers[0].Args
	changed := false
	for i, a := range args {
		if strings.HasPrefix(a, "--spawner=") && a != "--spawner=false" {
			args[i], changed = "--spawner=false", true
		}
	}
	if !changed && !slices.Contains(args, "--spawner=false") {
		args, changed = append(args, "--spawner=false"), true
	}
	if changed {
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containers": []map[string]any{{"name": d.Spec.Template.Spec.Containers[0].Name, "args": args}},
		}}}})
		if err != nil {
			return err
		}
		if err := cl.Patch(ctx, &d, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
			return fmt.Errorf("turning the spawner off in Deployment %s: %w", key, err)
		}
		fmt.Printf("Deployment %s: spawner off, waiting for the rollout\n", key)
	}
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, key, &d); err != nil {
			return false, fmt.Errorf("reading Deployment %s: %w", key, err)
		}
		st := d.Status
		return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == st.Replicas && st.AvailableReplicas >= 1 &&
			st.Replicas == ptr.Deref(d.Spec.Replicas, 1), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Deployment %s to roll out without the spawner: %w", key, err)
	}
	return nil
}

// endBuildJobs marks every BuildJob of the namespace as stopped for the uninstall, deletes
// them all, and waits until the controller has ended each on Buildkite and let it go.
func endBuildJobs(ctx context.Context, cl client.Client, namespace string) error {
	if err := markUninstall(ctx, cl, namespace); err != nil {
		return err
	}
	if err := cl.DeleteAllOf(ctx, &bkv1.BuildJob{}, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("deleting the BuildJobs of %s: %w", namespace, err)
	}
	left := 0
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var list bkv1.BuildJobList
		if err := cl.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return false, fmt.Errorf("listing the BuildJobs of %s: %w", namespace, err)
		}
		if left = len(list.Items); left > 0 {
			fmt.Printf("%d BuildJobs are being ended on Buildkite\n", left)
		}
		return left == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d BuildJobs of %s to be ended: %w", left, namespace, err)
	}
	fmt.Printf("every BuildJob of %s is ended\n", namespace)
	return nil
}

// markUninstall annotates every BuildJob of the namespace that is not being deleted yet
// with the uninstall as its stop reason, before it is deleted: the controller reads it
// when it works out how the job ended, and says in the job's log that the operator is
// being uninstalled. It is no condition of the drain: a BuildJob made after the list, or
// a drain whose Role may not patch BuildJobs, still has its job ended, with the words of
// any deleted BuildJob.
func markUninstall(ctx context.Context, cl client.Client, namespace string) error {
	var list bkv1.BuildJobList
	if err := cl.List(ctx, &list, client.InNamespace(namespace)); err != nil {
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
		err := cl.Patch(ctx, bj, patch)
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			fmt.Printf("cannot mark the BuildJobs of %s as stopped for the uninstall (%v): their jobs' logs will only say that their BuildJobs were deleted\n", namespace, err)
			return nil
		case err != nil:
			return fmt.Errorf("marking BuildJob %s/%s as stopped for the uninstall: %w", namespace, bj.Name, err)
		}
	}
	return nil
}
