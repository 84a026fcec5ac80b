package image

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Binaries are static agentd and agentd-supervise programs for one platform.
type Binaries struct {
	Platform           v1.Platform
	Agentd, Supervisor string
}

// BuildStatic builds agentd and agentd-supervise from the repository at root as the image
// ships them: without cgo, stripped, without local paths, agentd's version set, for
// platform, into dir.
func BuildStatic(ctx context.Context, root, dir, version string, platform v1.Platform) (Binaries, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("creating %s: %w", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Binaries{}, fmt.Errorf("resolving %s: %w", dir, err)
	}
	// One go build for both: they share most of their packages. With -o a folder, each
	// program is named after its package's folder.
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version,
		"-o", abs+string(filepath.Separator), "./cmd/agentd", "./cmd/agentd-supervise")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+platform.OS, "GOARCH="+platform.Architecture)
	if out, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("building agentd for %s in %s: %w\n%s", platform, root, err, out)
	}
	return Binaries{
		Platform:   platform,
		Agentd:     filepath.Join(abs, "agentd"),
		Supervisor: filepath.Join(abs, "agentd-supervise"),
	}, nil
}

// elfMachines are the ELF machines of the architectures a release can build for.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// requireMachine fails for a program that is not built for arch: an image whose config
// says arm64 must not carry an amd64 agentd.
func requireMachine(p, arch string) error {
	want, ok := elfMachines[arch]
	if !ok {
		return fmt.Errorf("architecture %q is not one a release builds for (amd64, arm64)", arch)
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s is not an ELF program: %w", p, err)
	}
	defer func() { _ = f.Close() }()
	if f.Machine != want {
		return fmt.Errorf("%s is built for %s, not %s (%s)", p, f.Machine, arch, want)
	}
	return nil
}
