// Command agentd-supervise is `agentd supervise` on its own: the supervisor that runs one job
// inside its pod and streams its output to Buildkite. The job pod's install init container
// copies it from the operator's image and the job container runs it. It is a binary of its
// own because agentd holds the whole operator (client-go, controller-runtime): running
// `agentd supervise` touched 39 MiB of agentd's pages, twice the supervisor's own memory,
// and every job container paid for them (docs/performance.md).
package main

import (
	"os"

	"github.com/buildkite-operator/buildkite-operator/pkg/supervisor"
)

func main() {
	// The supervisor's exit code is the command's, so that the container's is too.
	os.Exit(supervisor.Main(os.Args[1:], os.Environ(), os.Stderr))
}
