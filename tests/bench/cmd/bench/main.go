// Command bench runs the operator's job benchmark (package tests/bench) for each size of
// jobs in flight, prints a table per size and writes them all as JSON.
//
//	go run ./tests/bench/cmd/bench -backend kwok -sizes 10,100,1000 -json bench.json
//	go run ./tests/bench/cmd/bench -backend node -sizes 10 -json bench-node.json   # root
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/tests/bench"
)

func main() {
	var (
		backend, sizes, jsonPath, dir, agentd, operatorArgs, operatorEnv string
		rounds                                                           int
		commandDuration, timeout, nodeWait                               time.Duration
	)
	flag.StringVar(&backend, "backend", bench.BackendKwok, "where pods run: kwok (a real API server, simulated nodes) or node (the local node; root)")
	flag.StringVar(&sizes, "sizes", "10,100,1000", "comma-separated jobs in flight (the operator's slots), one run each")
	flag.IntVar(&rounds, "rounds", 2, "jobs queued per slot: each run queues size × rounds jobs at once")
	flag.DurationVar(&commandDuration, "command-duration", 0, "how long each job's command runs")
	flag.StringVar(&jsonPath, "json", "bench.json", "write the results here, as a JSON array")
	flag.StringVar(&dir, "dir", "", "keep each run's logs, kubeconfigs and audit log under this folder (default: a temporary one, removed after a run that passed)")
	flag.StringVar(&agentd, "agentd", "", "the agentd binary to run as the operator (default: built from this checkout)")
	flag.StringVar(&operatorArgs, "operator-args", "", "more flags for `agentd operator`, space-separated")
	flag.StringVar(&operatorEnv, "operator-env", "", "NAME=value pairs for `agentd operator`'s environment alone, space-separated (GOMEMLIMIT=200MiB)")
	flag.DurationVar(&timeout, "timeout", 30*time.Minute, "how long one run's jobs may take")
	flag.DurationVar(&nodeWait, "node-wait", 30*time.Minute, "node backend: how long to wait for another local node (the end-to-end suite) to stop")
	flag.Parse()
	// The bench's own clients log nothing worth reading; the components log to files.
	log.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, backend, sizes, rounds, commandDuration, jsonPath, dir, agentd, strings.Fields(operatorArgs), strings.Fields(operatorEnv), timeout, nodeWait); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, backend, sizes string, rounds int, commandDuration time.Duration, jsonPath, dir, agentd string,
	operatorArgs, operatorEnv []string, timeout, nodeWait time.Duration) error {
	var ns []int
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-sizes: %q is not a positive number of jobs", s)
		}
		ns = append(ns, n)
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s bench: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if agentd == "" {
		tmp, err := os.MkdirTemp("", "bench-agentd-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		logf("building agentd")
		if agentd, err = bench.BuildAgentd(ctx, tmp); err != nil {
			return err
		}
	}
	var results []*bench.Result
	for _, n := range ns {
		cfg := bench.Config{
			Backend: backend, InFlight: n, Rounds: rounds, CommandDuration: commandDuration, Timeout: timeout,
			Agentd: agentd, OperatorArgs: operatorArgs, OperatorEnv: operatorEnv, NodeWait: nodeWait, Logf: logf,
		}
		if dir != "" {
			cfg.Dir = filepath.Join(dir, fmt.Sprintf("%s-%d", backend, n))
		}
		res, err := bench.Run(ctx, cfg)
		if err != nil {
			return fmt.Errorf("%d jobs in flight: %w", n, err)
		}
		fmt.Println()
		res.Print(os.Stdout)
		results = append(results, res)
		// Written after each size, so that a later size that fails keeps the earlier ones.
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", jsonPath, err)
		}
	}
	return nil
}
