package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeavesTheOperatorOut: the supervisor's binary is small because it links none of the
// operator's Kubernetes machinery; one import of the API types (say, for a constant) brings
// all of it back, and with it 30 MiB of memory in every job container. The supervisor's
// pod-side facts live in pkg/podcontract for that reason.
func TestLeavesTheOperatorOut(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, heavy := range []string{"k8s.io/", "sigs.k8s.io/", "github.com/prometheus/", "buildkite-operator/pkg/apis/"} {
			if strings.Contains(pkg, heavy) {
				t.Errorf("agentd-supervise links %s", pkg)
			}
		}
	}
}
