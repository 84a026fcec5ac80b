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
