package validation

import (
	"fmt"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// checkImage reports whether image is a reference the kubelet can pull. An empty image
// is reported as required, since a container without one is refused by the API server.
func checkImage(path *field.Path, image string) *field.Error {
	if image == "" {
		return field.Required(path, "give an image, such as golang:1.26 or registry.example.com/ci/go@sha256:...")
	}
	// ParseNormalizedNamed is the parser the kubelet and container runtimes use, so an
	// image it accepts is one they can at least try to pull.
	if _, err := reference.ParseNormalizedNamed(image); err != nil {
		return field.Invalid(path, image, fmt.Sprintf("not a valid image reference (%v); give one such as golang:1.26 or registry.example.com/ci/go@sha256:...", err))
	}
	return nil
}

// floatingTag reports whether image runs whatever the registry has under :latest,
// either named so or by leaving out both tag and digest.
func floatingTag(image string) bool {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return false
	}
	if _, ok := named.(reference.Digested); ok {
		return false
	}
	tagged, ok := named.(reference.Tagged)
	return !ok || tagged.Tag() == "latest"
}
