package zzglob

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// GlobOption changes how Glob and MultiGlob walk.
type GlobOption = func(*globConfig)

type globConfig struct {
	traverseSymlinks     bool
	walkIntermediateDirs bool
}

// TraverseSymlinks turns descending into symlinked directories on or off (on by
// default). A symlink that itself matches is passed to the callback either way; a
// symlinked directory that leads back to one of its own ancestors is never entered.
func TraverseSymlinks(traverse bool) GlobOption {
	return func(c *globConfig) { c.traverseSymlinks = traverse }
}

// WalkIntermediateDirs makes Glob also pass to the callback every directory it is about
// to descend into because the pattern may match below it, starting with the pattern's
// fixed root (but not that root's parents), so the callback can skip one with
// fs.SkipDir, and so that a missing or unreadable root is reported. Off by default.
func WalkIntermediateDirs(enable bool) GlobOption {
	return func(c *globConfig) { c.walkIntermediateDirs = enable }
}

// Glob calls fn, in the lexical order of fs.WalkDir, for each file or directory whose
// path matches the pattern, and with any error met walking towards one (fn's path is then
// the directory that could not be read). Paths are spelled as the pattern spells them:
// relative to the working directory for a relative pattern. The DirEntry describes the
// path itself, so a symlink is a symlink even when it is traversed. fn may return
// fs.SkipDir (skip that directory, or the rest of the directory holding that file) or
// fs.SkipAll (stop, without an error); any other error stops the walk and is returned.
func (p *Pattern) Glob(fn fs.WalkDirFunc, opts ...GlobOption) error {
	return stopped(p.glob(context.Background(), fn, newGlobConfig(opts)))
}

// MultiGlob globs every pattern in turn, as Glob does each, stopping at the first error
// or when ctx ends. fn is never called from two goroutines at once. A path that matches
// several patterns is passed to fn once for each.
func MultiGlob(ctx context.Context, patterns []*Pattern, fn fs.WalkDirFunc, opts ...GlobOption) error {
	cfg := newGlobConfig(opts)
	for _, p := range patterns {
		if err := p.glob(ctx, fn, cfg); err != nil {
			return stopped(err)
		}
	}
	return nil
}

func newGlobConfig(opts []GlobOption) globConfig {
	cfg := globConfig{traverseSymlinks: true}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// stopped turns the callback's request to stop everything into success.
func stopped(err error) error {
	if err == fs.SkipAll {
		return nil
	}
	return err
}

type walker struct {
	ctx context.Context
	cfg globConfig
	m   *machine
	fn  fs.WalkDirFunc
}

func (p *Pattern) glob(ctx context.Context, fn fs.WalkDirFunc, cfg globConfig) error {
	w := walker{ctx: ctx, cfg: cfg, m: p.m, fn: fn}
	for _, root := range p.roots {
		if err := w.root(root); err != nil {
			return err
		}
	}
	return nil
}

// root walks from one fixed root. The empty root is the working directory, which is
// listed but never itself passed to fn.
func (w *walker) root(root string) error {
	if root == "" {
		var here []os.FileInfo
		if info, err := os.Stat("."); err == nil {
			here = w.chain(nil, info)
		}
		return w.dir("", nil, w.m.start(), here)
	}
	set := w.m.advance(w.m.start(), root)
	// The root is a path the user wrote, so a symlink in it is followed as the OS would.
	info, err := os.Stat(root)
	if err != nil {
		if missing(err) && !w.cfg.walkIntermediateDirs {
			return nil // nothing there to match
		}
		return skipped(w.fn(root, nil, err))
	}
	d := fs.FileInfoToDirEntry(info)
	below, descend := w.below(root, set, info.IsDir())
	if w.m.matches(set) || (descend && w.cfg.walkIntermediateDirs) {
		switch err := w.fn(root, d, nil); {
		case err == fs.SkipDir:
			return nil
		case err != nil:
			return err
		}
	}
	if !descend {
		return nil
	}
	return w.dir(root, d, below, w.chain(nil, info))
}

// below returns the states for what lies under path, and whether anything there could
// match.
func (w *walker) below(path string, set states, isDir bool) (states, bool) {
	if !isDir {
		return nil, false
	}
	if !strings.HasSuffix(path, "/") {
		set = w.m.advance(set, "/")
	}
	return set, w.m.alive(set)
}

// dir lists the directory path (whose entry is d) and visits each entry the states
// allow. ancestors are the directories from the root down to path, to recognise a
// symlink loop; they are only kept when symlinks are traversed.
func (w *walker) dir(path string, d fs.DirEntry, set states, ancestors []os.FileInfo) error {
	list := path
	if list == "" {
		list = "."
	}
	entries, err := os.ReadDir(list)
	if err != nil {
		return skipped(w.fn(list, d, err))
	}
	for _, e := range entries {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		child := e.Name()
		if path != "" {
			child = strings.TrimSuffix(path, "/") + "/" + child
		}
		s := w.m.advance(set, e.Name())
		if len(s) == 0 {
			continue // the pattern cannot match this entry or anything under it
		}
		info, isDir := w.followed(child, e)
		below, descend := w.below(child, s, isDir)
		if descend && e.Type()&fs.ModeSymlink != 0 {
			for _, a := range ancestors {
				if os.SameFile(a, info) {
					descend = false // a loop back to an ancestor
				}
			}
		}
		if w.m.matches(s) || (descend && w.cfg.walkIntermediateDirs) {
			switch err := w.fn(child, e, nil); {
			case err == fs.SkipDir && isDir:
				continue
			case err == fs.SkipDir:
				return nil // as in fs.WalkDir: skip the rest of this directory
			case err != nil:
				return err
			}
		}
		if !descend {
			continue
		}
		if w.cfg.traverseSymlinks && info == nil { // a real directory
			if info, err = e.Info(); err != nil {
				if err := skipped(w.fn(child, e, err)); err != nil {
					return err
				}
				continue
			}
		}
		if err := w.dir(child, e, below, w.chain(ancestors, info)); err != nil {
			return err
		}
	}
	return nil
}

// chain adds a directory to its ancestors when symlinks are traversed (the only time a
// loop is possible).
func (w *walker) chain(ancestors []os.FileInfo, info os.FileInfo) []os.FileInfo {
	if !w.cfg.traverseSymlinks || info == nil {
		return ancestors
	}
	return append(ancestors, info)
}

// followed reports whether the entry is a directory to descend into: a directory, or, when
// symlinks are traversed, a symlink to one (returning its target's FileInfo). A broken
// symlink is simply not a directory.
func (w *walker) followed(path string, e fs.DirEntry) (os.FileInfo, bool) {
	if e.Type()&fs.ModeSymlink == 0 || !w.cfg.traverseSymlinks {
		return nil, e.IsDir()
	}
	info, err := os.Stat(path)
	if err != nil || !info.IsDir() {
		return nil, false
	}
	return info, true
}

// skipped treats fs.SkipDir from a callback given an error as "carry on".
func skipped(err error) error {
	if err == fs.SkipDir {
		return nil
	}
	return err
}

// missing reports whether err means the path is not there, including a path through a
// file ("a.txt/b").
func missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}
