package image

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// A release publishes the operator image, for every platform in ReleasePlatforms, as one
// image index <registry>/buildkite-operator:<version>, and the chart as
// oci://<registry>/charts/buildkite-operator at <version>, its values pinning the image by
// the index's digest.
const (
	// DefaultRegistry is the project's own registry path, named in a release's chart
	// values when no other is given.
	DefaultRegistry = "ghcr.io/buildkite-operator"
	// ImageName is the operator image's name under a registry path.
	ImageName = "buildkite-operator"
	// ChartName is the chart's name (its Chart.yaml's), its folder under charts/ and its
	// name under <registry>/charts.
	ChartName = "buildkite-operator"
)

// ReleasePlatforms are the platforms a release builds for.
var ReleasePlatforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64"},
}

// semver is Semantic Versioning 2.0.0's grammar of a version without build metadata:
// numbers without leading zeros, an optional pre-release of dot-separated identifiers.
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)` +
	`(-(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?$`)

// ValidateVersion accepts a release version as the image tag and the chart version take
// it: semantic, x.y.z or x.y.z-pre.release, without the git tag's leading v.
func ValidateVersion(v string) error {
	switch {
	case v == "":
		return errors.New("no version given: give one such as 0.1.0 (make release VERSION=0.1.0)")
	case strings.HasPrefix(v, "v") && semver.MatchString(v[1:]):
		return fmt.Errorf("version %q starts with v: give it without (VERSION=%s); the git tag is v%s", v, v[1:], v[1:])
	case strings.Contains(v, "+"):
		return fmt.Errorf("version %q has build metadata (+...), which an image tag cannot hold: leave it out, or make it part of a pre-release (-rc.1)", v)
	case !semver.MatchString(v):
		return fmt.Errorf("version %q is not a semantic version x.y.z or x.y.z-pre.release (such as 0.1.0 or 0.2.0-rc.1; numbers without leading zeros): make release VERSION=x.y.z", v)
	}
	return nil
}

// ReleaseOptions are the inputs of a release.
type ReleaseOptions struct {
	// Version is the release, checked by ValidateVersion.
	Version string
	// Revision labels the image (a git commit).
	Revision string
	// Registry is host[:port]/path the image and chart are named for and, with Push,
	// pushed to; DefaultRegistry when empty.
	Registry string
	// Push sends the image index and the chart to Registry.
	Push bool
	// PlainHTTP talks to Registry over http, for a local registry without TLS.
	PlainHTTP bool
	// Root is the repository: agentd's sources and charts/buildkite-operator.
	Root string
	// BinDir receives the binaries, in one folder per architecture; Root/bin/release
	// when empty.
	BinDir string
	// OutDir receives the OCI layout (image/) and the packaged chart;
	// Root/.cache/release/<Version> when empty.
	OutDir string
	// Helm is the helm CLI.
	Helm string
	// CABundle overrides the host's CA certificates (OperatorOptions.CABundle).
	CABundle string
	// Platforms to build for; ReleasePlatforms when empty.
	Platforms []v1.Platform
	// Logf receives progress messages.
	Logf func(format string, args ...any)
}

// ReleaseResult is what a release made.
type ReleaseResult struct {
	// Repository is the image's name (<registry>/buildkite-operator) and Digest its
	// index's digest.
	Repository string
	Digest     v1.Hash
	// Layout is the OCI layout holding the index, tagged Version.
	Layout string
	// ChartPackage is the packaged chart, and ChartRepository where it was (or would be)
	// pushed: oci://<registry>/charts.
	ChartPackage, ChartRepository string
	Version                       string
}

// Image is the image pinned by digest, as the released chart runs it.
func (r ReleaseResult) Image() string { return r.Repository + "@" + r.Digest.String() }

// Chart is the released chart's reference, as `helm install` takes it.
func (r ReleaseResult) Chart() string {
	return fmt.Sprintf("%s/%s --version %s", r.ChartRepository, ChartName, r.Version)
}

// Release builds agentd and agentd-supervise for every platform, the operator image
// index, its OCI layout and the chart, and pushes the index and chart when asked.
func Release(ctx context.Context, o ReleaseOptions) (ReleaseResult, error) {
	if err := ValidateVersion(o.Version); err != nil {
		return ReleaseResult{}, err
	}
	o = o.withDefaults()
	res := ReleaseResult{
		Repository:      o.Registry + "/" + ImageName,
		ChartRepository: "oci://" + o.Registry + "/charts",
		Layout:          filepath.Join(o.OutDir, "image"),
		Version:         o.Version,
	}
	// The repository must make a valid tag before anything long runs.
	tag, err := name.NewTag(res.Repository+":"+o.Version, insecure(o.PlainHTTP)...)
	if err != nil {
		return res, fmt.Errorf("registry %q does not make an image name: %w (give host[:port]/path, such as ghcr.io/acme)", o.Registry, err)
	}
	// Found first, so that a missing helm fails before the builds rather than after.
	helm, err := exec.LookPath(o.Helm)
	if err != nil {
		return res, fmt.Errorf("helm not found (run `make helm`, or set HELM): %w", err)
	}

	idx, err := buildIndex(ctx, o)
	if err != nil {
		return res, err
	}
	if err := writeIndex(o, idx, &res); err != nil {
		return res, err
	}
	o.Logf("packaging the chart for %s", res.Image())
	res.ChartPackage, err = PackageChart(ctx, ChartRelease{
		Helm:       helm,
		Dir:        filepath.Join(o.Root, "charts", ChartName),
		OutDir:     o.OutDir,
		Version:    o.Version,
		Repository: res.Repository,
		Digest:     res.Digest,
	})
	if err != nil {
		return res, err
	}
	if !o.Push {
		return res, nil
	}
	return res, push(ctx, o, helm, idx, tag, res)
}

// withDefaults fills in what o leaves empty: the project's registry (without a trailing
// slash), the folders under Root, every release platform and a silent Logf.
func (o ReleaseOptions) withDefaults() ReleaseOptions {
	if o.Registry == "" {
		o.Registry = DefaultRegistry
	}
	o.Registry = strings.TrimSuffix(o.Registry, "/")
	if o.BinDir == "" {
		o.BinDir = filepath.Join(o.Root, "bin", "release")
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.Root, ".cache", "release", o.Version)
	}
	if len(o.Platforms) == 0 {
		o.Platforms = ReleasePlatforms
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// buildIndex builds the static binaries for each of o's platforms and the operator image
// index that carries them.
func buildIndex(ctx context.Context, o ReleaseOptions) (v1.ImageIndex, error) {
	var bins []Binaries
	for _, p := range o.Platforms {
		o.Logf("building agentd and agentd-supervise %s for %s", o.Version, p)
		b, err := BuildStatic(ctx, o.Root, filepath.Join(o.BinDir, p.Architecture), o.Version, p)
		if err != nil {
			return nil, err
		}
		bins = append(bins, b)
	}
	return OperatorIndex(ctx, bins, OperatorOptions{Version: o.Version, Revision: o.Revision, CABundle: o.CABundle})
}

// writeIndex records idx's digest in res and writes idx as the OCI layout res names.
func writeIndex(o ReleaseOptions, idx v1.ImageIndex, res *ReleaseResult) error {
	var err error
	if res.Digest, err = idx.Digest(); err != nil {
		return fmt.Errorf("computing the image index digest: %w", err)
	}
	o.Logf("writing the image index %s as an OCI layout in %s", res.Digest, res.Layout)
	return WriteLayout(res.Layout, idx, o.Version)
}

// push sends the image index to tag and the packaged chart to its OCI repository.
func push(ctx context.Context, o ReleaseOptions, helm string, idx v1.ImageIndex, tag name.Tag, res ReleaseResult) error {
	o.Logf("pushing %s", tag)
	if err := PushIndex(ctx, idx, tag); err != nil {
		return err
	}
	o.Logf("pushing the chart to %s", res.ChartRepository)
	args := []string{"push", res.ChartPackage, res.ChartRepository}
	if o.PlainHTTP {
		args = append(args, "--plain-http")
	}
	if _, err := runHelm(ctx, helm, args...); err != nil {
		return err
	}
	return nil
}

// insecure lets a reference use plain http.
func insecure(plainHTTP bool) []name.Option {
	if plainHTTP {
		return []name.Option{name.Insecure}
	}
	return nil
}
