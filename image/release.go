package image

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	yaml "go.yaml.in/yaml/v3"
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

	var bins []Binaries
	for _, p := range o.Platforms {
		o.Logf("building agentd and agentd-supervise %s for %s", o.Version, p)
		b, err := BuildStatic(ctx, o.Root, filepath.Join(o.BinDir, p.Architecture), o.Version, p)
		if err != nil {
			return res, err
		}
		bins = append(bins, b)
	}
	idx, err := OperatorIndex(ctx, bins, OperatorOptions{Version: o.Version, Revision: o.Revision, CABundle: o.CABundle})
	if err != nil {
		return res, err
	}
	if res.Digest, err = idx.Digest(); err != nil {
		return res, fmt.Errorf("computing the image index digest: %w", err)
	}
	o.Logf("writing the image index %s as an OCI layout in %s", res.Digest, res.Layout)
	if err := WriteLayout(res.Layout, idx, o.Version); err != nil {
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
	o.Logf("pushing %s", tag)
	if err := PushIndex(ctx, idx, tag); err != nil {
		return res, err
	}
	o.Logf("pushing the chart to %s", res.ChartRepository)
	args := []string{"push", res.ChartPackage, res.ChartRepository}
	if o.PlainHTTP {
		args = append(args, "--plain-http")
	}
	if _, err := runHelm(ctx, helm, args...); err != nil {
		return res, err
	}
	return res, nil
}

// insecure lets a reference use plain http.
func insecure(plainHTTP bool) []name.Option {
	if plainHTTP {
		return []name.Option{name.Insecure}
	}
	return nil
}

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

// ChartRelease is what PackageChart needs.
type ChartRelease struct {
	// Helm is the helm CLI; Dir the chart's folder; OutDir where the package goes.
	Helm, Dir, OutDir string
	// Version is the chart's version and appVersion.
	Version string
	// Repository and Digest are the released image, written into the chart's values.
	Repository string
	Digest     v1.Hash
}

// PackageChart packages a copy of the chart whose values name the released image by
// repository and digest, as version, into OutDir, and returns the package's path. It
// refuses a chart that would not run that image: one whose schema does not take
// image.digest, or whose Deployment does not pin it.
func PackageChart(ctx context.Context, c ChartRelease) (string, error) {
	tmp, err := os.MkdirTemp("", "bko-release-chart-")
	if err != nil {
		return "", fmt.Errorf("creating a folder for the chart's copy: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	dir := filepath.Join(tmp, ChartName)
	if err := copyTree(c.Dir, dir); err != nil {
		return "", fmt.Errorf("copying the chart %s: %w", c.Dir, err)
	}
	if err := requireDigestValue(filepath.Join(dir, "values.schema.json"), c.Dir); err != nil {
		return "", err
	}
	values := filepath.Join(dir, "values.yaml")
	data, err := os.ReadFile(values)
	if err != nil {
		return "", fmt.Errorf("reading the chart's values: %w", err)
	}
	if data, err = setImage(data, c.Repository, c.Digest.String()); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(c.Dir, "values.yaml"), err)
	}
	if err := os.WriteFile(values, data, 0o644); err != nil {
		return "", fmt.Errorf("writing the chart's values: %w", err)
	}
	if err := requirePinnedImage(ctx, c.Helm, dir, c.Repository, c.Digest); err != nil {
		return "", fmt.Errorf("the chart %s: %w", c.Dir, err)
	}
	if err := os.MkdirAll(c.OutDir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", c.OutDir, err)
	}
	if _, err := runHelm(ctx, c.Helm, "package", dir, "--version", c.Version, "--app-version", c.Version, "--destination", c.OutDir); err != nil {
		return "", err
	}
	return filepath.Join(c.OutDir, fmt.Sprintf("%s-%s.tgz", ChartName, c.Version)), nil
}

// copyTree copies the folder src to dst, following symbolic links as helm does: the
// chart's crds/ is a link to the repository's crds/, which a copied link would lose.
func copyTree(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		info, err := os.Stat(from)
		if err != nil {
			return err
		}
		if info.IsDir() {
			err = copyTree(from, to)
		} else {
			err = copyFile(from, to, info.Mode().Perm())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func copyFile(from, to string, perm os.FileMode) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, perm)
}

// requireDigestValue fails when the chart's values schema closes image's properties
// without image.digest: helm would refuse the released chart's own values at install.
func requireDigestValue(schemaPath, chartDir string) error {
	data, err := os.ReadFile(schemaPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the chart's values schema: %w", err)
	}
	var schema struct {
		Properties struct {
			Image struct {
				AdditionalProperties *bool                      `json:"additionalProperties"`
				Properties           map[string]json.RawMessage `json:"properties"`
			} `json:"image"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		return fmt.Errorf("reading %s: %w", filepath.Join(chartDir, "values.schema.json"), err)
	}
	img := schema.Properties.Image
	if _, ok := img.Properties["digest"]; !ok && img.AdditionalProperties != nil && !*img.AdditionalProperties {
		return fmt.Errorf("%s does not allow image.digest, which a release sets to pin the image: "+
			"helm would refuse the released chart's values; add a digest property to image (and use it in the image reference)",
			filepath.Join(chartDir, "values.schema.json"))
	}
	return nil
}

// setImage sets image.repository and image.digest in a chart's values, keeping the rest
// of the file and its comments.
func setImage(values []byte, repository, digest string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("parsing: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("the values are not a mapping")
	}
	image := mappingValue(doc.Content[0], "image")
	if image == nil || image.Kind != yaml.MappingNode {
		return nil, errors.New("no image mapping (image.repository, image.digest) in the values")
	}
	setScalar(image, "repository", repository)
	setScalar(image, "digest", digest)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("writing: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("writing: %w", err)
	}
	return buf.Bytes(), nil
}

// mappingValue is the value of key in mapping m, nil when absent.
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// setScalar sets key to the string value in mapping m, adding the key when absent.
func setScalar(m *yaml.Node, key, value string) {
	if v := mappingValue(m, key); v != nil {
		v.Kind, v.Tag, v.Value, v.Style, v.Content = yaml.ScalarNode, "!!str", value, 0, nil
		return
	}
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
}

// requirePinnedImage renders the chart's Deployment from its values and fails unless its
// containers run repository pinned by digest.
func requirePinnedImage(ctx context.Context, helm, dir, repository string, digest v1.Hash) error {
	out, err := runHelm(ctx, helm, "template", ChartName, dir, "--show-only", "templates/deployment.yaml")
	if err != nil {
		return fmt.Errorf("rendering the Deployment: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	found := 0
	for {
		var obj struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name  string `yaml:"name"`
							Image string `yaml:"image"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the rendered Deployment: %w", err)
		}
		if obj.Kind != "Deployment" {
			continue
		}
		for _, c := range obj.Spec.Template.Spec.Containers {
			if !strings.HasPrefix(c.Image, repository) || !strings.HasSuffix(c.Image, "@"+digest.String()) {
				return fmt.Errorf("its Deployment's container %s runs %q with image.repository=%s and image.digest=%s: "+
					"the chart must pin the image by image.digest (%s[:tag]@%s)", c.Name, c.Image, repository, digest, repository, digest)
			}
			found++
		}
	}
	if found == 0 {
		return errors.New("templates/deployment.yaml renders no Deployment container")
	}
	return nil
}

// runHelm runs helm and returns its standard output; a failure carries its output.
func runHelm(ctx context.Context, helm string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, helm, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out, nil
}
