package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bkv1 "github.com/buildkite-operator/buildkite-operator/pkg/apis/v1alpha1"
	"github.com/buildkite-operator/buildkite-operator/tests/gen"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// fieldOwner is the server-side apply manager of what the harness installs.
const fieldOwner = client.FieldOwner("bk-operator-e2e")

// Scheme knows the core types, CRDs and the operator's API.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, bkv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(fmt.Sprintf("building the scheme: %v", err))
		}
	}
	return s
}

// InstallCRDs applies crds/*.yaml server-side (the BuildEnvironment CRD is too large for the
// last-applied annotation of a client-side apply) and waits until they are established.
func InstallCRDs(ctx context.Context, c client.Client) error {
	files, err := filepath.Glob(filepath.Join(testkit.RepoRoot(), "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs found in %s (run `make generate`): %v", filepath.Join(testkit.RepoRoot(), "crds"), err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return fmt.Errorf("parsing %s: %w", f, err)
		}
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		crd.ManagedFields = nil
		body, err := json.Marshal(crd)
		if err != nil {
			return fmt.Errorf("encoding CRD %s: %w", crd.Name, err)
		}
		if err := c.Patch(ctx, crd, client.RawPatch(types.ApplyPatchType, body), fieldOwner, client.ForceOwnership); err != nil {
			return fmt.Errorf("applying CRD %s: %w", crd.Name, err)
		}
		name := crd.Name
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			var got apiextensionsv1.CustomResourceDefinition
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &got); err != nil {
				return false, nil
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", name, err)
		}
	}
	return nil
}

// SampleEnvironments are the BuildEnvironments the demo and the suite start with:
// "bootstrap" runs buildkite-agent bootstrap (the operator's default runner: checkout,
// hooks, plugins, meta-data, pipeline upload), which needs the build's repository;
// "default", "command" and "small" (a memory limit for OOM) use the Command runner, which
// runs the command under the supervisor alone, for the fake's builds that have no
// repository (Buildkite always gives one).
func SampleEnvironments(namespace, image string, pull corev1.PullPolicy) []*bkv1.BuildEnvironment {
	mk := func(name string, mod gen.BuildEnvironmentModifier) *bkv1.BuildEnvironment {
		return gen.BuildEnvironment(name, gen.SetBuildEnvironmentNamespace(namespace),
			gen.SetBuildEnvironmentImage(image), gen.SetBuildEnvironmentImagePullPolicy(pull), mod)
	}
	return []*bkv1.BuildEnvironment{
		mk("default", gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
		// The busybox job image has no bash: the supervisor runs the agent's commands and
		// hooks under /bin/sh, and says so in the log.
		mk("bootstrap", gen.SetBuildEnvironmentRunner(bkv1.RunnerBootstrap)),
		mk("command", gen.SetBuildEnvironmentRunner(bkv1.RunnerCommand)),
		mk("small", func(be *bkv1.BuildEnvironment) {
			be.Spec.Runner = bkv1.RunnerCommand
			gen.SetBuildEnvironmentResources(corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
			})(be)
		}),
	}
}

// ApplyEnvironment creates or replaces a BuildEnvironment.
func (e *Env) ApplyEnvironment(ctx context.Context, be *bkv1.BuildEnvironment) error {
	be = be.DeepCopy()
	be.Namespace = e.JobNamespace
	var cur bkv1.BuildEnvironment
	err := e.Client.Get(ctx, client.ObjectKeyFromObject(be), &cur)
	switch {
	case err == nil:
		be.ResourceVersion = cur.ResourceVersion
		err = e.Client.Update(ctx, be)
	case client.IgnoreNotFound(err) == nil:
		err = e.Client.Create(ctx, be)
	}
	if err != nil {
		return fmt.Errorf("applying BuildEnvironment %s: %w", be.Name, err)
	}
	return nil
}
