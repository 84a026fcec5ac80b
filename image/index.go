package image

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// OperatorIndex builds the operator image (the Operator recipe) for each platform's
// binaries and gathers them into one image index, each manifest with its platform. o gives
// the labels and CA bundle; its binaries are each platform's.
func OperatorIndex(ctx context.Context, bins []Binaries, o OperatorOptions) (v1.ImageIndex, error) {
	if len(bins) == 0 {
		return nil, errors.New("no platform to build the operator image for")
	}
	idx := v1.ImageIndex(empty.Index)
	var labels map[string]string
	for _, b := range bins {
		for _, p := range []string{b.Agentd, b.Supervisor} {
			if err := requireMachine(p, b.Platform.Architecture); err != nil {
				return nil, err
			}
		}
		o.Agentd, o.Supervisor = b.Agentd, b.Supervisor
		spec, err := Operator(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("the operator image for %s: %w", b.Platform, err)
		}
		labels = spec.Labels
		spec.Platform = b.Platform
		img, err := Build(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("the operator image for %s: %w", b.Platform, err)
		}
		p := b.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	// The index carries the images' labels as annotations: registries show them for a
	// multi-platform image (GitHub's links the package to its repository by the source).
	annotated, ok := mutate.Annotations(idx, labels).(v1.ImageIndex)
	if !ok {
		return nil, errors.New("annotating the image index gave no index")
	}
	return annotated, nil
}

// WriteLayout writes idx as an OCI image layout in dir (emptied first), its index.json
// naming the index by version, as `skopeo copy oci:dir:version` and `crane push` read it.
func WriteLayout(dir string, idx v1.ImageIndex, version string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("emptying %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing an OCI layout in %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
		return fmt.Errorf("writing the image index into %s: %w", dir, err)
	}
	return nil
}

// PushIndex sends idx to the registry of tag, with the credentials docker and podman keep
// (as Push does for one image) or anonymously.
func PushIndex(ctx context.Context, idx v1.ImageIndex, tag name.Tag) error {
	if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("pushing %s: %w", tag, err)
	}
	return nil
}
