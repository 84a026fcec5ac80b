// Command build-image builds the operator's image from static agentd and agentd-supervise
// binaries, without a Docker engine, and writes it as a tarball, pushes it, or both. Job
// pods get buildkite-agent from the agent's own image, not from this one.
//
//	build-image -agentd bin/linux/agentd -supervisor bin/linux/agentd-supervise \
//	    -tag ghcr.io/buildkite-operator/buildkite-operator:v0.1.0 -out .cache/images/operator.tar [-push]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/buildkite-operator/buildkite-operator/image"
)

func main() {
	var o image.OperatorOptions
	flag.StringVar(&o.Agentd, "agentd", "", "static agentd binary (required)")
	flag.StringVar(&o.Supervisor, "supervisor", "", "static agentd-supervise binary (required)")
	flag.StringVar(&o.Version, "version", "dev", "version label")
	flag.StringVar(&o.Revision, "revision", "", "source revision label (a git commit)")
	tag := flag.String("tag", "", "image reference, such as ghcr.io/acme/buildkite-operator:v0.1.0 (required)")
	out := flag.String("out", "", "write the image as a tarball here (for docker load or ctr images import)")
	push := flag.Bool("push", false, "push the image to the registry of -tag")
	flag.Parse()
	if o.Agentd == "" || o.Supervisor == "" || *tag == "" || (*out == "" && !*push) {
		fmt.Fprintln(os.Stderr, "build-image: -agentd, -supervisor, -tag and one of -out or -push are required")
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, *tag, *out, *push); err != nil {
		fmt.Fprintln(os.Stderr, "build-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o image.OperatorOptions, tag, out string, push bool) error {
	spec, err := image.Operator(ctx, o)
	if err != nil {
		return err
	}
	img, err := image.Build(ctx, spec)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("computing the image digest: %w", err)
	}
	if out != "" {
		if err := image.WriteTarball(img, tag, out); err != nil {
			return err
		}
		fmt.Printf("wrote %s (%s) to %s\n", tag, digest, out)
	}
	if push {
		if err := image.Push(ctx, img, tag); err != nil {
			return err
		}
		fmt.Printf("pushed %s@%s\n", tag, digest)
	}
	return nil
}
