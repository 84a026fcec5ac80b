package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
	// UID and GID own the entry; 0 (root) unless set.
	UID, GID int
}

// epoch keeps layers byte-identical between builds of the same files, so an image's
// digest changes only when its content does.
var epoch = time.Unix(0, 0).UTC()

// Layer packs the files into one image layer: parents first, each path once (the last
// entry for a path wins, so a recipe can override what an earlier helper added), with
// fixed times so the same files always give the same digest.
func Layer(ctx context.Context, files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := writeLayer(ctx, &buf, files); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("making a layer: %w", err)
	}
	return layer, nil
}

func writeLayer(ctx context.Context, w io.Writer, files []File) error {
	byPath := map[string]File{}
	for _, f := range files {
		p := strings.TrimPrefix(path.Clean("/"+f.Path), "/")
		if p == "" {
			continue
		}
		byPath[p] = f
		// Parent directories the recipe did not list get default modes.
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
		hdr := &tar.Header{Name: p, ModTime: epoch, Format: tar.FormatPAX, Uid: f.UID, Gid: f.GID}
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
