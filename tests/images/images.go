// Package images builds container images as `docker save` tarballs from files already on
// this machine, so that tests can run real pods without a registry or a Docker engine:
// containerd takes them with `ctr -n k8s.io images import`.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// File is one entry of an image's filesystem. Exactly one of Source, Data, Link or Dir
// says what it is.
type File struct {
	// Path is where the entry lives in the image (absolute or relative to /).
	Path string
	// Source is a file on the host whose content is copied (symlinks are followed).
	Source string
	// Data is literal content.
	Data []byte
	// Link makes the entry a symbolic link to this target.
	Link string
	// Dir makes the entry a directory.
	Dir bool
	// Mode is the permission bits; 0 means 0755 for directories and executable
	// sources, 0644 otherwise.
	Mode fs.FileMode
}

// Spec describes one image.
type Spec struct {
	// Name is the image reference, e.g. "bk-operator/job:dev".
	Name string
	// OutDir receives <name-without-registry, / and : replaced>.tar.
	OutDir     string
	Files      []File
	Env        []string
	Entrypoint []string
	Cmd        []string
	WorkingDir string
}

// epoch keeps layer tarballs byte-identical between builds of the same files, so the
// image digest only changes when the content does.
var epoch = time.Unix(0, 0).UTC()

// TarName is the tarball file name Build writes for an image name.
func TarName(name string) string {
	r := strings.NewReplacer("/", "_", ":", "_", "@", "_")
	return r.Replace(name) + ".tar"
}

// Build writes the image as a `docker save` tarball (one layer) and returns its path.
func Build(ctx context.Context, spec Spec) (string, error) {
	if spec.Name == "" || spec.OutDir == "" {
		return "", fmt.Errorf("image spec needs a Name and an OutDir")
	}
	if err := os.MkdirAll(spec.OutDir, 0o755); err != nil {
		return "", fmt.Errorf("creating image output folder: %w", err)
	}
	var layer bytes.Buffer
	if err := writeLayer(ctx, &layer, spec.Files); err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Name, err)
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerHex := hex.EncodeToString(layerSum[:])

	env := spec.Env
	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	config := map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Env":        env,
			"Entrypoint": spec.Entrypoint,
			"Cmd":        spec.Cmd,
			"WorkingDir": spec.WorkingDir,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerHex}},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "tests/images"}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return "", fmt.Errorf("encoding image config: %w", err)
	}
	configSum := sha256.Sum256(configJSON)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	layerName := layerHex + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{spec.Name},
		"Layers":   []string{layerName},
	}})
	if err != nil {
		return "", fmt.Errorf("encoding image manifest: %w", err)
	}

	out := filepath.Join(spec.OutDir, TarName(spec.Name))
	// A temporary name of its own: two builds of one image (tests in parallel packages)
	// must not write into the same file.
	f, err := os.CreateTemp(spec.OutDir, TarName(spec.Name)+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("creating a file in %s: %w", spec.OutDir, err)
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }()
	tw := tar.NewWriter(f)
	entries := []struct {
		name string
		data []byte
	}{
		{layerHex + "/", nil},
		{layerName, layer.Bytes()},
		{configName, configJSON},
		{"manifest.json", manifest},
	}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if strings.HasSuffix(e.name, "/") {
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("writing %s: %w", out, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return "", fmt.Errorf("writing %s: %w", out, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("writing %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("renaming %s: %w", tmp, err)
	}
	return out, nil
}

// writeLayer writes the files as a tar, parents first, each path once (the last entry for
// a path wins, so a spec can override what an earlier helper added).
func writeLayer(ctx context.Context, w io.Writer, files []File) error {
	byPath := map[string]File{}
	for _, f := range files {
		p := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if p == "" {
			continue
		}
		byPath[p] = f
		// Parent directories the spec did not list get default modes.
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	tw := tar.NewWriter(w)
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return err
		}
		f := byPath[p]
		hdr := &tar.Header{Name: p, ModTime: epoch, Format: tar.FormatPAX}
		var content []byte
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, p+"/", tarMode(orMode(f.Mode, 0o755))
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		case f.Source != "":
			data, err := os.ReadFile(f.Source)
			if err != nil {
				return fmt.Errorf("reading %s for %s: %w", f.Source, p, err)
			}
			st, err := os.Stat(f.Source)
			if err != nil {
				return fmt.Errorf("reading %s: %w", f.Source, err)
			}
			content = data
			hdr.Typeflag, hdr.Mode = tar.TypeReg, tarMode(orMode(f.Mode, st.Mode().Perm()))
		default:
			content = f.Data
			hdr.Typeflag, hdr.Mode = tar.TypeReg, tarMode(orMode(f.Mode, 0o644))
		}
		hdr.Size = int64(len(content))
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("adding %s: %w", p, err)
		}
		if _, err := tw.Write(content); err != nil {
			return fmt.Errorf("adding %s: %w", p, err)
		}
	}
	return tw.Close()
}

func orMode(m, def fs.FileMode) fs.FileMode {
	if m != 0 {
		return m
	}
	return def
}

// tarMode turns Go's file mode into the Unix bits tar stores (Go keeps sticky and setuid
// outside the permission bits).
func tarMode(m fs.FileMode) int64 {
	v := int64(m.Perm())
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	return v
}
