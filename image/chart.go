package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	yaml "go.yaml.in/yaml/v3"
)

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
