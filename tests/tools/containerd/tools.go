//go:build tools

// Package containerd pins the container runtime that the local node (tests/cluster) runs:
// containerd, its runc shim and ctr.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
