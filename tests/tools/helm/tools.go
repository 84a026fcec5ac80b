//go:build tools

// Package helm pins the helm command that `make chart-lint`, the chart tests and the
// end-to-end install use, built from the Go module proxy into .cache/.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
