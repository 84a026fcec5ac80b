// Command fake-buildkite runs the fake Buildkite agent API standalone, for the demo, docker
// compose and people: point a buildkite-agent (or the operator) at the endpoint it prints,
// create builds with its control API, and watch them at its web page.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/buildkite-operator/buildkite-operator/tests/fakebuildkite"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "fake-buildkite: %v\n", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. The agent endpoint is printed to stdout on its own line, so that
// scripts can read it; everything else goes to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fake-buildkite", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("listen", "127.0.0.1:8080", "address to listen on, host:port (port 0 picks a free one)")
	token := fs.String("registration-token", "", "the token agents must register with (default \"fake-registration-token\", or $FAKE_BUILDKITE_REGISTRATION_TOKEN)")
	minute := fs.Duration("minute", time.Minute, "time scale: how long one minute of a step's timeout_in_minutes lasts, e.g. 1s to time jobs out quickly")
	ping := fs.Int("ping-interval", 1, "ping interval in seconds sent to agents at register (Buildkite's is 10)")
	noStreaming := fs.Bool("no-streaming", false, "do not offer the streaming ping: agents then poll every ping interval")
	heartbeat := fs.Int("heartbeat-interval", 5, "heartbeat interval in seconds sent to agents at register")
	jobStatus := fs.Int("job-status-interval", 1, "job status interval in seconds sent to agents at register")
	pipelineFile := fs.String("pipeline", "", "optional pipeline YAML file: one build is created from it at start")
	repo := fs.String("repo", "", "BUILDKITE_REPO of the build made from -pipeline")
	quiet := fs.Bool("quiet", false, "do not log events")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	if *token == "" {
		*token = os.Getenv("FAKE_BUILDKITE_REGISTRATION_TOKEN")
	}
	logger := log.New(stderr, "", log.LstdFlags)
	opts := fakebuildkite.Options{
		RegistrationToken: *token,
		PingInterval:      *ping,
		HeartbeatInterval: *heartbeat,
		JobStatusInterval: *jobStatus,
		MinuteDuration:    *minute,
		NoStreaming:       *noStreaming,
		Addr:              *addr,
	}
	if !*quiet {
		opts.Logf = logger.Printf
	}
	srv, err := fakebuildkite.Start(opts)
	if err != nil {
		return err
	}
	defer func() { _ = srv.Close() }()
	if *pipelineFile != "" {
		yaml, err := os.ReadFile(*pipelineFile)
		if err != nil {
			return fmt.Errorf("read -pipeline: %w", err)
		}
		b, err := srv.CreateBuild(fakebuildkite.BuildRequest{PipelineYAML: string(yaml), Repo: *repo})
		if err != nil {
			return fmt.Errorf("create a build from %s: %w", *pipelineFile, err)
		}
		logger.Printf("fake-buildkite: build #%d created: %s", b.Number, b.URL)
	}
	if _, err := fmt.Fprintln(stdout, srv.Endpoint()); err != nil {
		return fmt.Errorf("print the endpoint: %w", err)
	}
	logger.Printf("fake-buildkite: agent endpoint %s, web page %s/, control API %s/control/", srv.Endpoint(), srv.URL(), srv.URL())
	<-ctx.Done()
	return srv.Close()
}
