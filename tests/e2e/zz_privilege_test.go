package e2e

import (
	"flag"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/buildkite-operator/buildkite-operator/tests/auditlog"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/buildkite-operator/buildkite-operator/tests/e2e/harness"
	"github.com/buildkite-operator/buildkite-operator/tests/helmchart"
)

// grantsUnusedOnPurpose are permissions the chart grants that a passing run of the suite
// need not use, each with the reason it stays. A permission is scoped: "operator:" in the
// release namespace, "jobs:" in the job namespace, "cluster:" cluster-wide.
var grantsUnusedOnPurpose = map[string]string{
	// Informers list and watch. client-go's streaming watch-list carries the initial list
	// inside the watch, so the audit log shows only watch; an API server without that
	// feature, or a relist, needs list.
	"jobs:buildkite-operator.dev/buildjobs/list":         "informer's initial list (watch-list shows it as a watch)",
	"jobs:buildkite-operator.dev/buildenvironments/list": "informer's initial list (watch-list shows it as a watch)",
	"jobs:core/pods/list":                                "informer's initial list (watch-list shows it as a watch)",
	"jobs:core/secrets/list":                             "informer's initial list of the job token Secrets (watch-list shows it as a watch)",
	"jobs:core/limitranges/list":                         "informer's initial list (watch-list shows it as a watch)",
	// validation.CacheFirst reads an environment from the API server only when the cache
	// has not seen it (one created a moment before the job): the suite's are cached by then.
	"jobs:buildkite-operator.dev/buildenvironments/get": "an environment the cache has not seen yet, read past it",
	"jobs:events.k8s.io/events/patch":                   "the event recorder patches an event that repeats (a series); the suite's events need not repeat",
	// The pod's owner reference sets blockOwnerDeletion, which needs update on the owner's
	// finalizers where the OwnerReferencesPermissionEnforcement admission plugin is on
	// (OpenShift and some managed clusters); the local node does not enable it.
	"jobs:buildkite-operator.dev/buildjobs/finalizers/update": "blockOwnerDeletion under OwnerReferencesPermissionEnforcement",
	"jobs:buildkite-operator.dev/buildjobs/delete":            "the spawner deletes a BuildJob whose token Secret could not be made, and the controller deletes reported BuildJobs after their retention (1 h)",
	"operator:core/events/patch":                              "client-go's event recorder (leader election) patches an event that repeats",
	"jobs:core/configmaps/update":                             "the warm pods' CA bundle ConfigMap is updated when the webhook CA rotates (every ten years) or someone changed it; the suite only creates it",
	"jobs:core/secrets/update":                                "the spawner seals the token Secret of a BuildJob made by an operator from before seals (an upgrade with jobs in flight)",
}

func permission(scope, group, resource, verb string) string {
	if group == "" {
		group = "core"
	}
	return scope + ":" + group + "/" + resource + "/" + verb
}

// scopeOf names where a namespace is: the operator's own, the job namespace, or (empty)
// the cluster.
func scopeOf(e *harness.Env, namespace string) string {
	switch namespace {
	case "":
		return "cluster"
	case e.Namespace:
		return "operator"
	case e.JobNamespace:
		return "jobs"
	}
	return "other namespace " + namespace
}

// TestZLeastPrivilege reads the API server's audit log of the whole suite (it runs last): the
// operator, running as the chart's ServiceAccount, was never refused, and the chart grants it
// nothing that it did not use (but for the reasoned list above).
func TestZLeastPrivilege(t *testing.T) {
	e := needEnv(t)
	require.NotNil(t, e.Release, "the operator runs in the cluster with the chart's RBAC")
	require.NotNil(t, e.Node, "the audit log is the local node's")
	user := fmt.Sprintf("system:serviceaccount:%s:%s", e.Namespace, harness.ReleaseName)

	used := map[string]int{}
	var refused []string
	require.NoError(t, auditlog.EachInFile(e.Node.AuditLogPath(), func(ev *auditlog.Event) error {
		if ev.User.Username != user || ev.ObjectRef == nil {
			return nil
		}
		p := permission(scopeOf(e, ev.ObjectRef.Namespace), ev.ObjectRef.APIGroup, ev.Resource(), ev.Verb)
		used[p]++
		if ev.ForbiddenByRBAC() {
			refused = append(refused, p+" "+ev.RequestURI)
		}
		return nil
	}))
	require.NotEmpty(t, used, "no request of %s in the audit log", user)
	assert.Empty(t, refused, "the operator was refused: the chart's RBAC misses what the code uses")

	granted := grantedByChart(t, e)
	var unused []string
	for p := range granted {
		if used[p] == 0 {
			if _, ok := grantsUnusedOnPurpose[p]; !ok {
				unused = append(unused, p)
			}
		}
	}
	sort.Strings(unused)
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		t.Logf("a -run filter is set: only part of the suite ran, so unused grants are not checked (%d unused)", len(unused))
	} else {
		assert.Empty(t, unused, "the chart grants what the operator never used in the suite: remove the +kubebuilder:rbac verbs, or justify them in grantsUnusedOnPurpose")
	}
	var lines []string
	for p, n := range used {
		lines = append(lines, fmt.Sprintf("%6d %s", n, p))
	}
	sort.Strings(lines)
	t.Logf("requests of the operator by permission:\n%s", strings.Join(lines, "\n"))
}

// grantedByChart lists every scope:group/resource/verb the chart's Roles and ClusterRole
// grant.
func grantedByChart(t *testing.T, e *harness.Env) map[string]bool {
	t.Helper()
	out, err := helmchart.Render(e.Namespace, "--show-only", "templates/rbac.yaml", "--set", "jobNamespace.name="+e.JobNamespace)
	require.NoError(t, err)
	granted := map[string]bool{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var role struct {
			Kind     string                     `json:"kind"`
			Metadata struct{ Namespace string } `json:"metadata"`
			Rules    []rbacv1.PolicyRule        `json:"rules"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &role))
		if role.Kind != "Role" && role.Kind != "ClusterRole" {
			continue
		}
		for _, r := range role.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						granted[permission(scopeOf(e, role.Metadata.Namespace), g, res, v)] = true
					}
				}
			}
		}
	}
	require.NotEmpty(t, granted)
	return granted
}
