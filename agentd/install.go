package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func init() {
	register(command{"install", "copy agentd, or with --supervisor agentd-supervise, to DEST (and, with --agent, buildkite-agent beside it): the job pod's init container runs this", runInstall})
}

func runInstall(args []string) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	agent := fs.String("agent", "", "also copy this buildkite-agent binary, as buildkite-agent beside DEST")
	supervisor := fs.String("supervisor", "", "copy this agentd-supervise binary to DEST instead of agentd itself")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: agentd install [--agent /usr/local/bin/buildkite-agent] [--supervisor /usr/local/bin/agentd-supervise] DEST (for example /buildkite-operator/agentd-supervise)")
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
		// Checked before anything is copied, as the agent is below.
		return fmt.Errorf("the operator image has no agentd-supervise at %s, and jobs need it: build the image with `make image`: %w", src, err)
	}
	if *agent != "" {
		// Checked first, so that a missing agent fails the init container before anything
		// is copied, with what to do about it.
		if _, err := os.Stat(*agent); err != nil {
			return fmt.Errorf("the operator image has no buildkite-agent at %s, and jobs need it: build the image with `make image`: %w", *agent, err)
		}
		if err := install(*agent, filepath.Join(filepath.Dir(dest), "buildkite-agent")); err != nil {
			return err
		}
	}
	return install(src, dest)
}

// install copies src to dest with mode 0755. It writes a temporary file beside dest and
// renames it into place, so the job container never sees half a binary, even if the init
// container is killed and run again.
func install(src, dest string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("opening %s: %w", src, err)
	}
	defer func() { _ = in.Close() }()

	dir := filepath.Dir(dest)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dest)+"-*")
	if err != nil {
		return fmt.Errorf("installing into %s: %w", dir, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, in); err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, tmp.Name(), err)
	}
	// CreateTemp makes the file 0600 and the umask must not narrow 0755 either.
	if err := tmp.Chmod(0o755); err != nil {
		return fmt.Errorf("making %s executable: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("installing %s as %s: %w", filepath.Base(src), dest, err)
	}
	done = true
	return nil
}
