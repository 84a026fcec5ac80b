package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/buildkite-operator/buildkite-operator/pkg/install"
)

func init() {
	register(command{"install", "copy agentd, or with --supervisor agentd-supervise, to DEST: the job pod's init container runs this", runInstall})
}

// runInstall copies the supervisor into the job pod. buildkite-agent is not the operator
// image's to give: the pod's other init container copies it from the agent's image
// (podbuilder's agentInstall), so the platform team picks the agent's release.
func runInstall(args []string) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	supervisor := fs.String("supervisor", "", "copy this agentd-supervise binary to DEST instead of agentd itself")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: agentd install [--supervisor /usr/local/bin/agentd-supervise] DEST (for example /buildkite-operator/agentd-supervise)")
	}
	dest := fs.Arg(0)
	src := *supervisor
	if src == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding agentd's own executable: %w", err)
		}
		src = self
	} else if _, err := os.Stat(src); err != nil {
		// Checked before anything is copied, so that the init container fails with what to
		// do about it.
		return fmt.Errorf("the operator image has no agentd-supervise at %s, and jobs need it: build the image with `make image`: %w", src, err)
	}
	return install.Executable(src, dest)
}
