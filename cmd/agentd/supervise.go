package main

import (
	"os"

	"github.com/buildkite-operator/buildkite-operator/pkg/supervisor"
)

func init() {
	register(command{"supervise", "run one job and stream its output to Buildkite (job pods run the same as agentd-supervise)", func(args []string) error {
		// The supervisor's exit code is the command's, so that the container's is too.
		if code := supervisor.Main(args, os.Environ(), os.Stderr); code != 0 {
			os.Exit(code)
		}
		return nil
	}})
}
