//go:build tools

// Package kwok pins the kwok command that the job benchmark (tests/bench) runs against a
// real kube-apiserver to move pods through their phases on simulated nodes, built from the
// Go module proxy into .cache/tools.
package kwok

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
