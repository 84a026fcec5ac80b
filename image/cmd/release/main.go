// Command release cuts a release of buildkite-operator: static agentd and
// agentd-supervise for linux/amd64 and linux/arm64 (bin/release/<arch>/), the operator
// image for each gathered into one image index (an OCI layout in
// .cache/release/<version>/image/), and the Helm chart pinned to that index by digest
// (.cache/release/<version>/buildkite-operator-<version>.tgz). With -registry it pushes
// the index, tagged <version>, and the chart there. docs/releasing.md says how to cut one.
//
//	release -version 0.1.0 [-registry ghcr.io/buildkite-operator] [-plain-http]
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
	var o image.ReleaseOptions
	flag.StringVar(&o.Version, "version", "", "the release, x.y.z or x.y.z-pre.release without the tag's v (required)")
	flag.StringVar(&o.Registry, "registry", "", "push the image and chart to this host[:port]/path; without it nothing is pushed and the chart names "+image.DefaultRegistry)
	flag.BoolVar(&o.PlainHTTP, "plain-http", false, "talk to -registry over http (a local registry without TLS)")
	flag.StringVar(&o.Revision, "revision", "", "source revision label (a git commit)")
	flag.StringVar(&o.Root, "root", ".", "the repository's top folder")
	flag.StringVar(&o.BinDir, "bin", "", "where the binaries go, one folder per architecture (default <root>/bin/release)")
	flag.StringVar(&o.OutDir, "out", "", "where the OCI layout and the chart package go (default <root>/.cache/release/<version>)")
	flag.StringVar(&o.Helm, "helm", envOr("HELM", "helm"), "the helm CLI (`make helm` builds one; the Makefile sets $HELM)")
	flag.Parse()
	if o.PlainHTTP && o.Registry == "" {
		fmt.Fprintln(os.Stderr, "release: -plain-http needs -registry (PLAIN_HTTP=1 needs REGISTRY=host:port/path)")
		os.Exit(2)
	}
	o.Push = o.Registry != ""
	o.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "release: "+format+"\n", args...) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := image.Release(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	fmt.Printf("layout: %s (index tagged %s)\n", res.Layout, res.Version)
	fmt.Printf("package: %s\n", res.ChartPackage)
	if !o.Push {
		fmt.Println("nothing pushed: give REGISTRY=host[:port]/path to push the image and the chart")
	}
	fmt.Printf("image: %s\n", res.Image())
	fmt.Printf("chart: %s\n", res.Chart())
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
