package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/buildkite-operator/buildkite-operator/tests/cluster"
	"github.com/buildkite-operator/buildkite-operator/tests/images"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// nodeHost is what -node-sizes needs of the machine, so that its absence skips the node
// rows instead of failing a long bench near its end.
type nodeHost struct {
	euid int
	// kubeBin, containerdDir and imagesDir are the local node's defaults (tests/cluster,
	// `make cluster-binaries`; `make images`).
	kubeBin, containerdDir, imagesDir string
	lookPath                          func(string) (string, error)
}

func thisHost() nodeHost {
	cache := filepath.Join(testkit.RepoRoot(), ".cache")
	return nodeHost{euid: os.Geteuid(), kubeBin: filepath.Join(cache, "kube-v1.35.4"), containerdDir: cluster.DefaultContainerdDir(),
		imagesDir: filepath.Join(cache, "images"), lookPath: exec.LookPath}
}

// whyNoNode says why the node cannot run here, or "" when it can as far as the bench
// can tell: root, the Kubernetes binaries, the images and the container runtime. The
// local node checks the rest itself when it starts (tests/cluster).
func (h nodeHost) whyNoNode() string {
	if h.euid != 0 {
		return "not root: the local node mounts, and creates cgroups and network devices"
	}
	var missing []string
	for _, b := range []string{"kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(h.kubeBin, b)); err != nil {
			missing = append(missing, b+" in "+h.kubeBin+" (make cluster-binaries)")
		}
	}
	for _, img := range []string{images.JobImage, images.AgentdImage} {
		tar := filepath.Join(h.imagesDir, images.TarName(img))
		if _, err := os.Stat(tar); err != nil {
			missing = append(missing, tar+" (make images)")
		}
	}
	for _, b := range []string{"containerd", "ctr"} {
		if _, err := os.Stat(filepath.Join(h.containerdDir, b)); err != nil {
			missing = append(missing, b+" in "+h.containerdDir+" (make cluster-binaries)")
		}
	}
	if _, err := h.lookPath("runc"); err != nil {
		missing = append(missing, "runc (make node-deps)")
	}
	if len(missing) > 0 {
		return fmt.Sprintf("missing %s", strings.Join(missing, ", "))
	}
	return ""
}
