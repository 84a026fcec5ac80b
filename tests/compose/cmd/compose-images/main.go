// Command compose-images writes the images docker-compose.yml runs as `docker save` tarballs
// into a folder (`make compose-images` puts them in .cache/compose-images), built from this
// machine's files without a Docker engine. Load them with `docker load -i <tarball>`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/buildkite-operator/buildkite-operator/tests/compose"
)

func main() {
	out := flag.String("out", "", "folder for the tarballs (required)")
	agent := flag.String("agent", "", "static buildkite-agent binary (default: $BUILDKITE_AGENT_BINARY or .cache, as `make agent-binary` builds it)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "compose-images: -out <folder> is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	paths, err := compose.BuildImages(ctx, *out, *agent)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-images:", err)
		os.Exit(1)
	}
	for _, p := range paths {
		fmt.Println(p)
	}
}
