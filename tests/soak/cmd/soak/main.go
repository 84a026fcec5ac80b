// Command soak runs the chaos soak (package tests/soak) on the local node, prints its table
// and writes the result as JSON. It exits 1 when a job was lost, doubled, stuck or left with
// an incomplete log. Run it as root; `make soak` builds what it needs first.
//
//	go run ./tests/soak/cmd/soak -jobs 300 -json .cache/soak.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildkite-operator/buildkite-operator/tests/bench"
	"github.com/buildkite-operator/buildkite-operator/tests/soak"
)

// output is the JSON file: the result, with the command and the machine it ran on.
type output struct {
	*soak.Result
	Command string        `json:"command"`
	Machine bench.Machine `json:"machine"`
	Passed  bool          `json:"passed"`
}

func main() {
	d := soak.DefaultConfig(300)
	var (
		jobs, slots      int
		jsonPath, dir    string
		agentd           string
		seed             uint64
		timeout, bound   time.Duration
		killMin, killMax time.Duration
		webhooks         bool
		warmPool         int
	)
	flag.IntVar(&jobs, "jobs", 300, "how many jobs run through the operator")
	flag.IntVar(&slots, "slots", d.Slots, "the operator's slots (jobs in flight)")
	flag.StringVar(&jsonPath, "json", "soak.json", "write the result here")
	flag.StringVar(&dir, "dir", "", "keep the operator's log and the node's state here (default: a temporary folder, removed after a run that passed)")
	flag.StringVar(&agentd, "agentd", "", "the agentd binary run as the operator (required; `make soak` builds it)")
	flag.Uint64Var(&seed, "seed", uint64(time.Now().UnixNano()), "seed of the schedule of faults")
	flag.DurationVar(&timeout, "timeout", 0, "how long the jobs may take in all (default: 6 s a job plus 10 minutes)")
	flag.DurationVar(&bound, "bound", d.Bound, "a job that takes longer than this from accept to finish is stuck")
	flag.DurationVar(&killMin, "kill-min", d.KillEvery.Min, "the shortest time between two kills of the operator")
	flag.DurationVar(&killMax, "kill-max", d.KillEvery.Max, "the longest time between two kills of the operator")
	flag.BoolVar(&webhooks, "webhooks", d.Webhooks, "serve the admission webhooks from the operator on the host, as in the cluster")
	flag.IntVar(&warmPool, "warm-pool", int(d.WarmPool), "the warm pool of the jobs' environment (0: none; with -webhooks=false, none: the hand-off is served beside the webhooks)")
	flag.Parse()
	log.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !webhooks {
		warmPool = 0
	}
	passed, err := run(ctx, jobs, slots, jsonPath, dir, agentd, seed, timeout, bound, soak.Span{Min: killMin, Max: killMax}, webhooks, int32(warmPool))
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if !passed {
		os.Exit(1)
	}
}

func run(ctx context.Context, jobs, slots int, jsonPath, dir, agentd string, seed uint64, timeout, bound time.Duration, kill soak.Span, webhooks bool, warmPool int32) (bool, error) {
	if agentd == "" {
		return false, fmt.Errorf("-agentd: give the agentd binary to run (make build puts it in bin/agentd)")
	}
	cfg := soak.DefaultConfig(jobs)
	cfg.Slots, cfg.Seed, cfg.Bound, cfg.KillEvery, cfg.Webhooks, cfg.WarmPool = slots, seed, bound, kill, webhooks, warmPool
	if timeout > 0 {
		cfg.Timeout = timeout
	}
	keep := dir != ""
	if !keep {
		var err error
		if dir, err = os.MkdirTemp("", "bk-operator-soak-"); err != nil {
			return false, err
		}
	}
	var err error
	if cfg.Agentd, err = filepath.Abs(agentd); err != nil {
		return false, err
	}
	cfg.Dir = dir
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s soak: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	machine := bench.DescribeMachine()
	cfg.Logf("%d jobs, %d slots, seed %d, logs in %s", jobs, slots, seed, dir)
	res, err := soak.Run(ctx, cfg)
	if err != nil {
		return false, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	machine.LoadAfter = bench.DescribeMachine().LoadBefore
	fmt.Println(res.Table())
	if res.Audit.Failed() || len(res.Audit.Problems) > 0 {
		fmt.Println(res.Audit.String())
	}
	out := output{Result: res, Command: strings.Join(os.Args, " "), Machine: machine, Passed: res.Passed()}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
		return false, err
	}
	cfg.Logf("result written to %s", jsonPath)
	if res.Passed() && !keep {
		_ = os.RemoveAll(dir)
	} else {
		cfg.Logf("logs kept in %s", dir)
	}
	return res.Passed(), nil
}
