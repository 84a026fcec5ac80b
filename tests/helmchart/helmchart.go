// Package helmchart runs the helm CLI on the operator's chart for the tests: rendering it
// (the plain-manifest install, the webhook configurations envtest installs) and finding helm.
// It imports nothing that registers command-line flags, so commands such as the demo can use it.
package helmchart

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// HelmVersion is the helm release `make helm` builds into .cache/tools.
const HelmVersion = "v3.20.2"

// HelmBinary is the helm CLI: $HELM when set (the Makefile sets it), else the one `make
// helm` builds.
func HelmBinary() string {
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	return filepath.Join(testkit.RepoRoot(), ".cache", "tools", "helm-"+HelmVersion)
}

// ChartDir is the operator's Helm chart.
func ChartDir() string { return filepath.Join(testkit.RepoRoot(), "charts", "buildkite-operator") }

// Render runs `helm template` on the chart for a release in namespace, with the given
// extra helm arguments (--set, --show-only, ...), and returns the manifests.
func Render(namespace string, args ...string) ([]byte, error) {
	helm := HelmBinary()
	if _, err := os.Stat(helm); err != nil {
		return nil, fmt.Errorf("helm not found at %s: run `make helm`: %w", helm, err)
	}
	cmd := exec.Command(helm, append([]string{"template", "buildkite-operator", ChartDir(), "--namespace", namespace}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm template: %w: %s", err, stderr.String())
	}
	return out, nil
}

// WebhookManifests writes the chart's webhook Service and configurations, as a user's
// install would have them but for every namespace (the webhook tests use several), into dir
// and returns the file, for envtest's WebhookInstallOptions.Paths.
func WebhookManifests(dir, namespace string) (string, error) {
	out, err := Render(namespace, "--show-only", "templates/webhooks.yaml", "--set", "webhooks.allNamespaces=true")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "webhooks.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}

// Objects decodes rendered manifests (Render's output) into objects, skipping empty
// documents.
func Objects(manifests []byte) ([]*unstructured.Unstructured, error) {
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the rendered chart: %w", err)
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			return nil, fmt.Errorf("decoding the rendered chart: %w", err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// ApplyServiceAccount creates the chart's ServiceAccount, Roles, ClusterRole and their
// bindings for a release in namespace whose job namespace is jobNamespace (both must exist),
// with c (an admin's client), and returns the user name to impersonate to act as that
// ServiceAccount: tests then run the operator's components with nothing but the chart's
// permissions.
func ApplyServiceAccount(ctx context.Context, c client.Client, namespace, jobNamespace string) (string, error) {
	out, err := Render(namespace, "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml",
		"--set", "jobNamespace.name="+jobNamespace)
	if err != nil {
		return "", err
	}
	objs, err := Objects(out)
	if err != nil {
		return "", err
	}
	name := ""
	for _, obj := range objs {
		if obj.GetKind() == "ServiceAccount" {
			name = obj.GetName()
		}
		if err := c.Create(ctx, obj); err != nil {
			return "", fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	if name == "" {
		return "", fmt.Errorf("the chart rendered no ServiceAccount")
	}
	return fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name), nil
}
