// Package image builds container images without a Docker engine: the operator's own image
// (Operator) and, for the tests, any image described as a list of files (Build). Layers are
// packed here from files on this machine; github.com/google/go-containerregistry assembles
// the image, writes it as a tarball that `docker load` and `ctr images import` read, and
// pushes it to a registry. Release (image/cmd/release) builds a release: the operator image
// for each of ReleasePlatforms as one index, and the chart pinned to it.
package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH of an image that sets none.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Spec describes one single-layer image.
type Spec struct {
	Files      []File
	Env        []string
	Entrypoint []string
	Cmd        []string
	WorkingDir string
	// User runs the image's processes, as uid:gid; root when empty.
	User string
	// Labels are the image's labels (org.opencontainers.image.* among them).
	Labels map[string]string
	// Platform the image runs on; linux on this machine's architecture when empty. The
	// files must be built for it (a release builds each platform's binaries).
	Platform v1.Platform
}

// Build assembles the image the spec describes, for spec.Platform (this machine's when
// empty).
func Build(ctx context.Context, spec Spec) (v1.Image, error) {
	layer, err := Layer(ctx, spec.Files)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "buildkite-operator image builder"},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = "linux", runtime.GOARCH, ""
	if spec.Platform.Architecture != "" {
		cf.OS, cf.Architecture, cf.Variant = spec.Platform.OS, spec.Platform.Architecture, spec.Platform.Variant
	}
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Env = spec.Env
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = []string{DefaultPath}
	}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.WorkingDir = spec.WorkingDir
	cf.Config.User = spec.User
	cf.Config.Labels = spec.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	return img, nil
}

// TarName is the file name WriteTarball gives an image reference in a folder.
func TarName(ref string) string {
	r := strings.NewReplacer("/", "_", ":", "_", "@", "_")
	return r.Replace(ref) + ".tar"
}

// WriteTarball writes img, tagged ref, as a `docker save` tarball at path (written under a
// temporary name and renamed, so a reader never sees half an image).
func WriteTarball(img v1.Image, ref, path string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("creating a file beside %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := tarball.Write(tag, img, tmp); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp.Name(), err)
	}
	return nil
}

// Push sends img to the registry of ref, with the credentials docker and podman keep
// (~/.docker/config.json, $DOCKER_CONFIG, $REGISTRY_AUTH_FILE) or anonymously.
func Push(ctx context.Context, img v1.Image, ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}
