package images

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/buildkite-operator/buildkite-operator/image"
	"github.com/buildkite-operator/buildkite-operator/pkg/podbuilder"
	"github.com/buildkite-operator/buildkite-operator/pkg/podcontract"
	"github.com/buildkite-operator/buildkite-operator/tests/testkit"
)

// The images the project's tests and demo use. Without a registry part, containerd and the
// kubelet both read them as docker.io/<name>.
const (
	PauseImage  = "bk-operator/pause:dev"
	JobImage    = "bk-operator/job:dev"
	AgentdImage = "bk-operator/agentd:dev"
	// AgentImage is the agent's image under the reference job pods use by default
	// (podbuilder.DefaultAgentImage, the chart's agentImage), so that a test installs the
	// chart with its default values. The tests cannot pull from Docker Hub: BuildAgent makes
	// a stand-in from the agent binary the tests build, of the same release.
	AgentImage = podbuilder.DefaultAgentImage
)

// GoBuildStatic builds a Go package of this module as a static binary (no cgo), so it runs
// in an image without libraries.
func GoBuildStatic(ctx context.Context, pkg, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(out), err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = testkit.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// BuildPause builds the sandbox image: a static program that waits for a signal.
func BuildPause(ctx context.Context, outDir string) (string, error) {
	bin := filepath.Join(outDir, "bin", "pause")
	if err := GoBuildStatic(ctx, "./tests/images/pause", bin); err != nil {
		return "", err
	}
	return Build(ctx, Spec{Name: PauseImage, OutDir: outDir, Spec: image.Spec{
		Files:      []File{{Path: "/pause", Source: bin, Mode: 0o755}},
		Entrypoint: []string{"/pause"},
	}})
}

// BuildJob builds the job image: busybox, git, the ssh client (for private repositories
// over SSH) and the real buildkite-agent, with /workspace as the working folder. Base gives
// it the job pods' user, uid 1000, which ssh needs.
func BuildJob(ctx context.Context, outDir, agentBinary string) (string, error) {
	if agentBinary == "" {
		agentBinary = testkit.AgentBinary()
	}
	if _, err := os.Stat(agentBinary); err != nil {
		return "", fmt.Errorf("buildkite-agent %s not found at %s: run `make agent-binary`: %w", testkit.AgentVersion, agentBinary, err)
	}
	files := Base()
	// A buildkite-agent built with cgo (the default on a host with a C compiler) needs
	// glibc; the libraries come along like git's.
	agentLibs, err := Libraries(ctx, agentBinary)
	if err != nil {
		return "", err
	}
	files = append(files, agentLibs...)
	bb, err := Busybox(ctx)
	if err != nil {
		return "", err
	}
	files = append(files, bb...)
	git, err := Git(ctx)
	if err != nil {
		return "", err
	}
	files = append(files, git...)
	ssh, err := SSH(ctx)
	if err != nil {
		return "", err
	}
	files = append(files, ssh...)
	files = append(files,
		File{Path: "/usr/local/bin/buildkite-agent", Source: agentBinary, Mode: 0o755},
		File{Path: "/buildkite/builds", Dir: true, Mode: 0o777},
		File{Path: "/buildkite/hooks", Dir: true},
		File{Path: "/buildkite/plugins", Dir: true, Mode: 0o777},
	)
	return Build(ctx, Spec{Name: JobImage, OutDir: outDir, Spec: image.Spec{
		Files: files,
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"HOME=/root",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
		Cmd:        []string{"/bin/sh"},
		WorkingDir: "/workspace",
	}})
}

// BuildAgent builds the stand-in of Buildkite's agent image, tagged AgentImage: what job
// pods copy from it (podbuilder's agent init container) is where Buildkite's image has it,
// /usr/local/bin/buildkite-agent, with busybox (from the busybox-static package) for the
// shell and cp the copy runs with. Buildkite's image is Alpine's busybox around a static
// agent, so the copy meets the same tools.
func BuildAgent(ctx context.Context, outDir, agentBinary string) (string, error) {
	if agentBinary == "" {
		agentBinary = testkit.AgentBinary()
	}
	if _, err := os.Stat(agentBinary); err != nil {
		return "", fmt.Errorf("buildkite-agent %s not found at %s: run `make agent-binary`: %w", testkit.AgentVersion, agentBinary, err)
	}
	// Job images need not have the agent's libraries: the copy must run anywhere.
	if err := image.RequireStatic(agentBinary); err != nil {
		return "", fmt.Errorf("%w: the agent image's buildkite-agent runs in every job image, so build it with CGO_ENABLED=0 (make agent-binary does)", err)
	}
	files := Base()
	bb, err := Busybox(ctx)
	if err != nil {
		return "", err
	}
	files = append(files, bb...)
	files = append(files, File{Path: podcontract.AgentImageBinaryPath, Source: agentBinary, Mode: 0o755})
	return Build(ctx, Spec{Name: AgentImage, OutDir: outDir, Spec: image.Spec{
		Files:      files,
		Entrypoint: []string{podcontract.AgentImageBinaryPath},
		Cmd:        []string{"start"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "buildkite-agent (local stand-in)",
			"org.opencontainers.image.description": "buildkite-agent " + testkit.AgentVersion + " and busybox, built by tests/images for the local node in place of Buildkite's image",
			"org.opencontainers.image.version":     strings.TrimPrefix(testkit.AgentVersion, "v"),
		},
	}})
}

// BuildAgentd builds the operator's image (image.Operator) from this checkout: static agentd
// and agentd-supervise.
func BuildAgentd(ctx context.Context, outDir string) (string, error) {
	bin := filepath.Join(outDir, "bin", "agentd")
	if err := GoBuildStatic(ctx, "./cmd/agentd", bin); err != nil {
		return "", err
	}
	supervisor := filepath.Join(outDir, "bin", "agentd-supervise")
	if err := GoBuildStatic(ctx, "./cmd/agentd-supervise", supervisor); err != nil {
		return "", err
	}
	spec, err := image.Operator(ctx, image.OperatorOptions{Agentd: bin, Supervisor: supervisor, Version: "dev"})
	if err != nil {
		return "", err
	}
	return Build(ctx, Spec{Name: AgentdImage, OutDir: outDir, Spec: spec})
}

// Retag writes the image of the tarball src (tagged from) again under the reference to, into
// dir, for an upgrade to a "new" image without building one.
func Retag(src, from, to, dir string) (string, error) {
	tag, err := name.NewTag(from)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", from, err)
	}
	img, err := tarball.ImageFromPath(src, &tag)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", src, err)
	}
	out := filepath.Join(dir, TarName(to))
	if err := image.WriteTarball(img, to, out); err != nil {
		return "", err
	}
	return out, nil
}
