// Command buildimages writes the project's image tarballs (pause, job, agentd, and agent,
// the stand-in of Buildkite's agent image under the reference job pods use by default) into
// a folder, ready for `ctr -n k8s.io images import` or `localnode -images <dir> up`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/buildkite-operator/buildkite-operator/tests/images"
)

func main() {
	out := flag.String("out", "", "folder for the tarballs (required)")
	agent := flag.String("agent", "", "static buildkite-agent binary for the job and agent images (default: $BUILDKITE_AGENT_BINARY or .cache)")
	which := flag.String("only", "pause,job,agentd,agent", "comma-separated images to build")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "buildimages: -out <folder> is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, name := range strings.Split(*which, ",") {
		var path string
		var err error
		switch strings.TrimSpace(name) {
		case "pause":
			path, err = images.BuildPause(ctx, *out)
		case "job":
			path, err = images.BuildJob(ctx, *out, *agent)
		case "agentd":
			path, err = images.BuildAgentd(ctx, *out)
		case "agent":
			path, err = images.BuildAgent(ctx, *out, *agent)
		default:
			err = fmt.Errorf("unknown image %q: choose among pause, job, agentd, agent", name)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "buildimages:", err)
			os.Exit(1)
		}
		fmt.Println(path)
	}
}
