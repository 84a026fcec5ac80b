package chart

import (
	"flag"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/pkg/flagenv"
	"github.com/buildkite-operator/buildkite-operator/pkg/webhook"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// clusterScoped are the kinds the chart may render without a namespace. Any other object
// without one is a mistake the test reports, so that a new cluster-scoped kind is not
// left out of the collision checks below.
var clusterScoped = map[string]bool{
	"CustomResourceDefinition":       true,
	"Namespace":                      true,
	"ClusterRole":                    true,
	"ClusterRoleBinding":             true,
	"ValidatingWebhookConfiguration": true,
	"MutatingWebhookConfiguration":   true,
}

// everything turns on every value that adds an object, so that the collision checks see
// them all.
var everything = []string{
	"--include-crds",
	"--set", "webhooks.certManager.enabled=true",
	"--set", "metrics.serviceMonitor.enabled=true",
	"--set", "metrics.prometheusRule.enabled=true",
	"--set", "metrics.grafanaDashboard.enabled=true",
	"--set", "buildEnvironments.default.image=golang:1.26",
}

// renderRelease runs helm template for the release name in namespace.
func renderRelease(t *testing.T, name, namespace string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmchart.HelmBinary(), append([]string{"template", name, helmchart.ChartDir(), "--namespace", namespace}, args...)...)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Fatalf("helm template %s: %v: %s", name, err, ee.Stderr)
	}
	require.NoError(t, err)
	return out
}

type objectID struct{ kind, namespace, name string }

func (o objectID) String() string {
	if o.namespace == "" {
		return o.kind + " " + o.name
	}
	return o.kind + " " + o.namespace + "/" + o.name
}

// objectIDs lists the rendered objects, checking that only the cluster-scoped kinds lack a
// namespace.
func objectIDs(t *testing.T, out []byte) []objectID {
	t.Helper()
	var ids []objectID
	for _, d := range docs(t, out) {
		var obj struct {
			Kind     string            `json:"kind"`
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		require.NoError(t, sigsyaml.Unmarshal(d, &obj))
		if obj.Kind == "" {
			continue // a template's comments alone
		}
		id := objectID{obj.Kind, obj.Metadata.Namespace, obj.Metadata.Name}
		assert.Equal(t, clusterScoped[obj.Kind], id.namespace == "", "%s: only cluster-scoped kinds are rendered without a namespace", id)
		ids = append(ids, id)
	}
	return ids
}

// shared returns the objects two renderings both hold, those for which keep is true.
func shared(a, b []objectID, keep func(objectID) bool) []string {
	seen := map[objectID]bool{}
	for _, id := range a {
		seen[id] = true
	}
	var out []string
	for _, id := range b {
		if seen[id] && keep(id) {
			out = append(out, id.String())
		}
	}
	sort.Strings(out)
	return out
}

// Several operators share a cluster: every cluster-scoped object but the CRDs (which
// they share, as they share the API) derives its name from the release and its namespace,
// so that releases of the same name in two namespaces, the usual case, collide nowhere.
// Releases in one namespace need distinct names and the values docs/install.md lists
// ("Several operators in one cluster"); given those, they collide nowhere either.
func TestReleasesShareNoName(t *testing.T) {
	t.Run("two namespaces", func(t *testing.T) {
		// Their dashboards go to one namespace, the Grafana sidecar's.
		args := append(slices.Clone(everything), "--set", "metrics.grafanaDashboard.namespace=monitoring")
		a := objectIDs(t, renderRelease(t, "buildkite-operator", "ci-a", args...))
		b := objectIDs(t, renderRelease(t, "buildkite-operator", "ci-b", args...))
		assert.Empty(t, shared(a, b, func(id objectID) bool { return id.kind != "CustomResourceDefinition" }),
			"objects of two releases in two namespaces with the same name")
		assert.NotEmpty(t, shared(a, b, func(id objectID) bool { return id.kind == "CustomResourceDefinition" }), "the CRDs are shared")
		var kinds []string
		for _, id := range a {
			if id.namespace == "" {
				kinds = append(kinds, id.kind)
			}
		}
		for kind := range clusterScoped {
			assert.Contains(t, kinds, kind, "the renderings hold every cluster-scoped kind, so each was compared")
		}
	})
	t.Run("one namespace", func(t *testing.T) {
		a := objectIDs(t, renderRelease(t, "ci-linux", "buildkite", append(slices.Clone(everything),
			"--set", "jobNamespace.name=ci-linux-jobs", "--set", "buildkite.name=ci-linux")...))
		b := objectIDs(t, renderRelease(t, "ci-arm", "buildkite", append(slices.Clone(everything),
			"--set", "jobNamespace.name=ci-arm-jobs", "--set", "buildkite.name=ci-arm")...))
		assert.Empty(t, shared(a, b, func(id objectID) bool { return id.kind != "CustomResourceDefinition" }),
			"objects of two releases in one namespace, each with its own job namespace")
	})
	t.Run("one namespace, job namespace left to its default", func(t *testing.T) {
		// What docs/install.md warns of: both would make and watch <namespace>-jobs.
		a := objectIDs(t, renderRelease(t, "ci-linux", "buildkite"))
		b := objectIDs(t, renderRelease(t, "ci-arm", "buildkite"))
		assert.Equal(t, []string{"Namespace buildkite-jobs"}, shared(a, b, func(objectID) bool { return true }))
	})
}

// The operator is told the name of its webhook configurations (--webhook-configuration-name,
// read as the operator reads it), both configurations have that name, and the operator's
// ClusterRole lets it update those two and nothing else of their kind. The name is the
// release's and its namespace's, like the chart's ClusterRoles.
func TestWebhookConfigurationName(t *testing.T) {
	for _, tc := range []struct {
		release, namespace, want string
	}{
		{"buildkite-operator", "buildkite", "buildkite-operator-buildkite"},
		{"buildkite-operator", "ci", "buildkite-operator-ci"},
		{"linux", "ci", "linux-buildkite-operator-ci"},
	} {
		t.Run(tc.release+" in "+tc.namespace, func(t *testing.T) {
			out := renderRelease(t, tc.release, tc.namespace)
			d := byKind[appsv1.Deployment](t, out, "Deployment")
			require.Len(t, d, 1)
			var o webhook.Options
			fs := flag.NewFlagSet("operator", flag.ContinueOnError)
			o.BindFlags(fs)
			var args []string
			for _, a := range d[0].Spec.Template.Spec.Containers[0].Args {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if fs.Lookup(name) != nil {
					args = append(args, a)
				}
			}
			require.NoError(t, flagenv.ParseEnv(fs, args, func(string) string { return "" }))
			assert.Equal(t, tc.want, o.WebhookConfigurationName, "what the operator is told")

			v := byKind[admissionregistrationv1.ValidatingWebhookConfiguration](t, out, "ValidatingWebhookConfiguration")
			m := byKind[admissionregistrationv1.MutatingWebhookConfiguration](t, out, "MutatingWebhookConfiguration")
			require.Len(t, v, 1)
			require.Len(t, m, 1)
			assert.Equal(t, tc.want, v[0].Name)
			assert.Equal(t, tc.want, m[0].Name)

			var names []string
			for _, cr := range byKind[rbacv1.ClusterRole](t, out, "ClusterRole") {
				for _, r := range cr.Rules {
					for _, res := range r.Resources {
						if strings.HasSuffix(res, "webhookconfigurations") {
							names = append(names, cr.Name+" "+res+": "+strings.Join(r.ResourceNames, ","))
						}
					}
				}
			}
			assert.Equal(t, []string{
				tc.want + " mutatingwebhookconfigurations: " + tc.want,
				tc.want + " validatingwebhookconfigurations: " + tc.want,
			}, names, "only the operator's ClusterRole touches webhook configurations, and only its own")
		})
	}
}

// Each release's webhooks judge its own job namespace only, so two operators never judge
// (or default) each other's BuildJobs; webhooks.allNamespaces gives that up (NOTES.txt
// and docs/install.md say so).
func TestWebhooksJudgeTheirOwnJobNamespace(t *testing.T) {
	selectors := func(out []byte) []string {
		var s []string
		for _, c := range byKind[admissionregistrationv1.ValidatingWebhookConfiguration](t, out, "ValidatingWebhookConfiguration") {
			for _, w := range c.Webhooks {
				s = append(s, metav1.FormatLabelSelector(w.NamespaceSelector))
			}
		}
		for _, c := range byKind[admissionregistrationv1.MutatingWebhookConfiguration](t, out, "MutatingWebhookConfiguration") {
			for _, w := range c.Webhooks {
				s = append(s, metav1.FormatLabelSelector(w.NamespaceSelector))
			}
		}
		return s
	}
	own := "kubernetes.io/metadata.name=ci-a-jobs"
	assert.Equal(t, []string{own, own, own}, selectors(renderRelease(t, "buildkite-operator", "ci-a")))
	all := renderRelease(t, "buildkite-operator", "ci-a", "--set", "webhooks.allNamespaces=true")
	assert.Equal(t, []string{"<none>", "<none>", "<none>"}, selectors(all), "every namespace")
}
