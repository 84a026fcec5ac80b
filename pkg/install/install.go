// Package install puts an executable into place the way the job pod's init container
// needs it: whole or not at all, even when the container is killed and run again.
package install

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Executable copies src to dest with mode 0755, creating dest's folder. It writes a
// temporary file beside dest and renames it into place, so the job container never sees
// half a binary, even if the init container is killed and run again.
func Executable(src, dest string) error {
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
