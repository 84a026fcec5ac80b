package drain

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// stopSpawner rolls the operator's Deployment to --spawner=false and waits for the rollout.
func (d *Drainer) stopSpawner(ctx context.Context) error {
	var dep appsv1.Deployment
	key := types.NamespacedName{Namespace: d.Namespace, Name: d.Deployment}
	if err := d.Client.Get(ctx, key, &dep); err != nil {
		if apierrors.IsNotFound(err) {
			d.printf("no Deployment %s: nothing takes jobs\n", key)
			return nil
		}
		return fmt.Errorf("reading Deployment %s: %w", key, err)
	}
	if len(dep.Spec.Template.Spec.Containers) == 0 {
		return fmt.Errorf("deployment %s has no container", key)
	}
	container := dep.Spec.Template.Spec.Containers[0]
	if args, changed := spawnerOff(container.Args); changed {
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containers": []map[string]any{{"name": container.Name, "args": args}},
		}}}})
		if err != nil {
			return err
		}
		if err := d.Client.Patch(ctx, &dep, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
			return fmt.Errorf("turning the spawner off in Deployment %s: %w", key, err)
		}
		d.printf("Deployment %s: spawner off, waiting for the rollout\n", key)
	}
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if err := d.Client.Get(ctx, key, &dep); err != nil {
			return false, fmt.Errorf("reading Deployment %s: %w", key, err)
		}
		return rolledOut(&dep), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Deployment %s to roll out without the spawner: %w", key, err)
	}
	return nil
}

// spawnerOff returns the operator container's args with the spawner turned off, and
// whether that changed them: every other --spawner= becomes --spawner=false, and one is
// added when there is none.
func spawnerOff(args []string) ([]string, bool) {
	args = slices.Clone(args)
	changed := false
	for i, a := range args {
		if strings.HasPrefix(a, "--spawner=") && a != "--spawner=false" {
			args[i], changed = "--spawner=false", true
		}
	}
	if !changed && !slices.Contains(args, "--spawner=false") {
		args, changed = append(args, "--spawner=false"), true
	}
	return args, changed
}

// rolledOut says whether every replica of d runs its latest template and one is available.
func rolledOut(d *appsv1.Deployment) bool {
	st := d.Status
	return st.ObservedGeneration >= d.Generation && st.UpdatedReplicas == st.Replicas && st.AvailableReplicas >= 1 &&
		st.Replicas == ptr.Deref(d.Spec.Replicas, 1)
}
