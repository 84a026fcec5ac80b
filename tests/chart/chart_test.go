// Package chart checks the Helm chart the way a user meets it: helm lint, the plain-manifest
// install rendered from it, its RBAC against the +kubebuilder:rbac markers, and every
// operator flag reachable from its values.
package chart

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// docs splits a multi-document YAML stream into its documents (empty ones dropped).
func docs(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var out [][]byte
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		d, err := r.Read()
		if err != nil {
			return out
		}
		if len(bytes.TrimSpace(d)) > 0 && !bytes.Equal(bytes.TrimSpace(d), []byte("---")) {
			out = append(out, d)
		}
	}
}

type meta struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// byKind decodes the documents of kind into out (a pointer to a slice of that type).
func byKind[T any](t *testing.T, data []byte, kind string) []T {
	t.Helper()
	var out []T
	for _, d := range docs(t, data) {
		var m meta
		require.NoError(t, sigsyaml.Unmarshal(d, &m))
		if m.Kind != kind {
			continue
		}
		var v T
		require.NoError(t, sigsyaml.Unmarshal(d, &v))
		out = append(out, v)
	}
	return out
}

func render(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := helmchart.Render("buildkite", args...)
	require.NoError(t, err)
	return out
}

func TestHelmLint(t *testing.T) {
	out, err := exec.Command(helmchart.HelmBinary(), "lint", "--strict", helmchart.ChartDir()).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// deploy/install.yaml is the chart rendered without its Helm hooks. kubectl knows nothing
// of hooks: it would create the pre-delete drain Job with everything else, and that Job
// deletes every BuildJob and turns the spawner off, so an operator installed with it would
// never take a job. The chart's own render keeps the hook, so the test would notice a chart
// whose hooks --no-hooks no longer leaves out.
func TestInstallManifestIsTheRenderedChart(t *testing.T) {
	committed, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "deploy", "install.yaml"))
	require.NoError(t, err)
	// The file is three comment lines, then exactly what helm template renders.
	_, body, ok := bytes.Cut(committed, []byte("\n---\n"))
	require.True(t, ok, "deploy/install.yaml has no manifests")
	want := render(t, "--include-crds", "--no-hooks")
	assert.True(t, bytes.Equal(append([]byte("---\n"), body...), want),
		"deploy/install.yaml differs from the chart: run `make install-manifest` and commit it")

	for name, manifests := range map[string][]byte{"deploy/install.yaml": committed, "the chart with the hooks": render(t, "--include-crds")} {
		hooks, drains := hooksAndDrains(t, manifests)
		if name == "deploy/install.yaml" {
			assert.Empty(t, hooks, "%s holds Helm hooks, which kubectl would apply as any object", name)
			assert.Empty(t, drains, "%s holds the drain, which kubectl would run at install", name)
			assert.False(t, bytes.Contains(committed, []byte("helm.sh/hook")), "%s mentions helm.sh/hook", name)
			continue
		}
		assert.Contains(t, hooks, "Job buildkite-operator-drain", "%s: the uninstall drain is a hook", name)
		assert.Equal(t, hooks, drains, "%s: the drain's objects are the chart's only hooks", name)
	}
}

// hooksAndDrains lists the objects of manifests ("Kind name") that are Helm hooks, and those
// that belong to the uninstall drain (component drain, or named <fullname>-drain).
func hooksAndDrains(t *testing.T, manifests []byte) (hooks, drains []string) {
	t.Helper()
	for _, d := range docs(t, manifests) {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				Template struct {
					Metadata struct {
						Labels map[string]string `json:"labels"`
					} `json:"metadata"`
				} `json:"template"`
			} `json:"spec"`
		}
		require.NoError(t, sigsyaml.Unmarshal(d, &obj))
		id := obj.Kind + " " + obj.Metadata.Name
		for k := range obj.Metadata.Annotations {
			if strings.HasPrefix(k, "helm.sh/hook") {
				hooks = append(hooks, id)
				break
			}
		}
		if obj.Spec.Template.Metadata.Labels["app.kubernetes.io/component"] == "drain" || strings.HasSuffix(obj.Metadata.Name, "-drain") {
			drains = append(drains, id)
		}
	}
	return hooks, drains
}

func TestValuesSchemaIsSelfContained(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(helmchart.ChartDir(), "values.schema.json"))
	require.NoError(t, err)
	var schema map[string]any
	require.NoError(t, json.Unmarshal(data, &schema))
	assert.NotContains(t, string(data), `"$ref"`, "helm lint must work offline: no remote $ref")
	// A wrong value is refused with the path that is wrong.
	out, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set", "buildkite.slots=0").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "/buildkite/slots")
}

// TestRBACIsTheMarkers: the chart's Roles are exactly what the +kubebuilder:rbac markers ask
// for, the markers' namespace "buildkite" giving the release namespace's Role and
// "buildkite-jobs" the job namespace's, and its ClusterRole the same limited by name to the
// operator's webhook configurations.
func TestRBACIsTheMarkers(t *testing.T) {
	generated, err := os.ReadFile(filepath.Join(helmchart.ChartDir(), "files", "rbac", "role.yaml"))
	require.NoError(t, err)
	wantRoles := map[string][]rbacv1.PolicyRule{}
	for _, r := range byKind[rbacv1.Role](t, generated, "Role") {
		wantRoles[r.Namespace] = r.Rules
	}
	require.Len(t, wantRoles, 2, "one Role for the operator's namespace, one for the job namespace")
	wantCluster := byKind[rbacv1.ClusterRole](t, generated, "ClusterRole")
	require.Len(t, wantCluster, 1)

	out := render(t, "--set", "jobNamespace.name=ci-jobs")
	gotRoles := map[string][]rbacv1.PolicyRule{}
	for _, r := range byKind[rbacv1.Role](t, out, "Role") {
		if r.Name == "buildkite-operator" { // not the uninstall hook's own Roles
			gotRoles[r.Namespace] = r.Rules
		}
	}
	assert.Equal(t, map[string][]rbacv1.PolicyRule{"buildkite": wantRoles["buildkite"], "ci-jobs": wantRoles["buildkite-jobs"]}, gotRoles)

	var operatorCR *rbacv1.ClusterRole
	for _, cr := range byKind[rbacv1.ClusterRole](t, out, "ClusterRole") {
		// The operator's own, not those for metrics readers and for users (user-rbac.yaml).
		if cr.Name == "buildkite-operator-buildkite" {
			operatorCR = &cr
		}
	}
	require.NotNil(t, operatorCR)
	require.Len(t, operatorCR.Rules, len(wantCluster[0].Rules))
	for i, rule := range operatorCR.Rules {
		want := wantCluster[0].Rules[i]
		if len(rule.APIGroups) == 1 && rule.APIGroups[0] == "admissionregistration.k8s.io" {
			assert.Equal(t, []string{"buildkite-operator-buildkite"}, rule.ResourceNames, "webhook configurations limited to the operator's own")
			rule.ResourceNames = nil
		}
		assert.Equal(t, want, rule)
	}
}

// TestEveryOperatorFlagIsAValue: each flag of `agentd operator` (docs/configuration.md lists
// them, generated from the code) is set by the chart's Deployment, so a value reaches it.
func TestEveryOperatorFlagIsAValue(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testkit.RepoRoot(), "docs", "configuration.md"))
	require.NoError(t, err)
	section := string(doc)
	section = section[strings.Index(section, "<!-- BEGIN flags of agentd operator"):]
	section = section[:strings.Index(section, "<!-- END")]
	flags := regexp.MustCompile("(?m)^\\| `--([a-z-]+)`").FindAllStringSubmatch(section, -1)
	require.NotEmpty(t, flags)

	deployments := byKind[appsv1.Deployment](t, render(t, "--set", "buildkite.tags.cluster=gke-prod", "--set", "buildkite.defaultBuildEnvironment=default"), "Deployment")
	require.Len(t, deployments, 1)
	args := strings.Join(deployments[0].Spec.Template.Spec.Containers[0].Args, "\n")
	// Logging details beyond level and encoder go through operator.extraArgs.
	// The registration token comes from a Secret (--registration-token-secret), never a file.
	throughExtraArgs := map[string]bool{"zap-devel": true, "zap-stacktrace-level": true, "zap-time-encoding": true, "registration-token-file": true}
	for _, f := range flags {
		if throughExtraArgs[f[1]] {
			continue
		}
		assert.Contains(t, args, "--"+f[1]+"=", "flag --%s is not set from a value", f[1])
	}
}

func TestDeploymentRunsAsTheImageUserWithLeaderElection(t *testing.T) {
	d := byKind[appsv1.Deployment](t, render(t), "Deployment")
	require.Len(t, d, 1)
	spec := d[0].Spec.Template.Spec
	require.NotNil(t, spec.SecurityContext.RunAsUser)
	assert.Equal(t, int64(65532), *spec.SecurityContext.RunAsUser, "the image's non-root uid")
	assert.True(t, *spec.SecurityContext.RunAsNonRoot)
	c := spec.Containers[0]
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.Equal(t, int32(2), *d[0].Spec.Replicas)
	assert.Contains(t, c.Args, "--leader-elect=true")
	assert.NotEmpty(t, spec.TopologySpreadConstraints)
	assert.NotContains(t, strings.Join(c.Args, " "), "token=", "no registration token value in the manifest")
}

// The job namespace is the chart's own, labelled for Pod Security admission with the level
// the operator builds job pods for, and never the release namespace.
func TestJobNamespace(t *testing.T) {
	cases := []struct {
		name      string
		args      []string
		wantNS    string
		wantLevel string
	}{
		{"default", nil, "buildkite-jobs", "restricted"},
		{"named, baseline", []string{"--set", "jobNamespace.name=ci", "--set", "jobNamespace.podSecurity=baseline"}, "ci", "baseline"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, tc.args...)
			nss := byKind[corev1.Namespace](t, out, "Namespace")
			require.Len(t, nss, 1)
			assert.Equal(t, tc.wantNS, nss[0].Name)
			for _, mode := range []string{"enforce", "warn", "audit"} {
				assert.Equal(t, tc.wantLevel, nss[0].Labels["pod-security.kubernetes.io/"+mode], mode)
			}
			assert.Equal(t, "keep", nss[0].Annotations["helm.sh/resource-policy"], "uninstall keeps the job namespace")
			deploys := byKind[appsv1.Deployment](t, out, "Deployment")
			require.Len(t, deploys, 1)
			args := deploys[0].Spec.Template.Spec.Containers[0].Args
			assert.Contains(t, args, "--job-namespace="+tc.wantNS)
			assert.Contains(t, args, "--job-pod-security="+tc.wantLevel)
		})
	}
	out, err := exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "-n", "ci", "--set", "jobNamespace.name=ci").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "give jobs a namespace of their own")
	out, err = exec.Command(helmchart.HelmBinary(), "template", "x", helmchart.ChartDir(), "--set", "jobNamespace.podSecurity=open").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "/jobNamespace/podSecurity")
}

// Go's profiles are off unless pprof.enabled, and then served on the pod's loopback
// address only (unauthenticated HTTP: reached with kubectl port-forward), with no port
// of the pod's declared for them.
func TestPprof(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"off by default", nil, "--pprof-bind-address=0"},
		{"on", []string{"--set", "pprof.enabled=true"}, "--pprof-bind-address=127.0.0.1:6060"},
		{"on, another port", []string{"--set", "pprof.enabled=true", "--set", "pprof.port=7070"}, "--pprof-bind-address=127.0.0.1:7070"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := byKind[appsv1.Deployment](t, render(t, tc.args...), "Deployment")
			require.Len(t, d, 1)
			c := d[0].Spec.Template.Spec.Containers[0]
			assert.Contains(t, c.Args, tc.want)
			for _, p := range c.Ports {
				assert.NotContains(t, []int32{6060, 7070}, p.ContainerPort, "port %s", p.Name)
			}
		})
	}
}

// The operator is told its container's memory limit, from which it sets the Go
// collector's soft limit; extra env still reaches it.
func TestMemoryLimitFromTheContainer(t *testing.T) {
	d := byKind[appsv1.Deployment](t, render(t, "--set", "operator.extraEnv[0].name=GOGC", "--set", "operator.extraEnv[0].value=50"), "Deployment")
	require.Len(t, d, 1)
	c := d[0].Spec.Template.Spec.Containers[0]
	assert.Contains(t, c.Args, "--memory-limit=$(BK_OPERATOR_MEMORY_LIMIT)")
	require.NotEmpty(t, c.Env)
	assert.Equal(t, corev1.EnvVar{Name: "BK_OPERATOR_MEMORY_LIMIT", ValueFrom: &corev1.EnvVarSource{
		ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "operator", Resource: "limits.memory"},
	}}, c.Env[0])
	assert.Equal(t, corev1.EnvVar{Name: "GOGC", Value: "50"}, c.Env[len(c.Env)-1], "extra env comes last")
	assert.Equal(t, "operator", c.Name)
}

// Each replica knows its own Pod from the downward API: the Buildkite preflight records its
// findings as events on it, which `kubectl describe pod` shows only with the Pod's UID.
func TestOperatorKnowsItsPod(t *testing.T) {
	d := byKind[appsv1.Deployment](t, render(t), "Deployment")
	require.Len(t, d, 1)
	env := map[string]string{}
	for _, e := range d[0].Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	assert.Equal(t, map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid"}, env)
}
