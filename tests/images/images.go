// Package images builds the images the tests and the demo run (the pod sandbox, the job
// image, and the operator's own image from package image) as `docker save` tarballs from
// files already on this machine, so that tests run real pods without a registry or a Docker
// engine: containerd takes them with `ctr -n k8s.io images import`.
package images

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/buildkite-operator/buildkite-operator/image"
)

// File is one entry of an image's filesystem (image.File).
type File = image.File

// Spec describes one test image.
type Spec struct {
	// Name is the image reference, e.g. "bk-operator/job:dev".
	Name string
	// OutDir receives TarName(Name).
	OutDir string
	image.Spec
}

// TarName is the tarball file name Build writes for an image name.
func TarName(name string) string { return image.TarName(name) }

// Build writes the image as a `docker save` tarball (one layer) and returns its path.
func Build(ctx context.Context, spec Spec) (string, error) {
	if spec.Name == "" || spec.OutDir == "" {
		return "", fmt.Errorf("image spec needs a Name and an OutDir")
	}
	img, err := image.Build(ctx, spec.Spec)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Name, err)
	}
	out := filepath.Join(spec.OutDir, TarName(spec.Name))
	if err := image.WriteTarball(img, spec.Name, out); err != nil {
		return "", err
	}
	return out, nil
}
