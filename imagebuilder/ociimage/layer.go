// Package ociimage writes workload images (docs/workload-images.md): a root filesystem
// tree as one deterministic layer, the OCI image around it (go-containerregistry), the
// OCI image-layout tar archive that `ctr images import` and `skopeo copy oci-archive:`
// read, and a push to a registry with a CA file and a containers auth file.
//
// Determinism is this package's job: the same tree, config and epoch give the same
// bytes and so the same manifest digest. Building the tree is not: that is package
// build, from the locked .debs.
package ociimage

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// EmptiedDirs keep only their own entry in a layer: the container runtime mounts or
// fills them (device nodes in a layer break unprivileged unpacking).
var EmptiedDirs = []string{"dev", "proc", "sys", "run", "tmp"}

// LayerFile is a gzip-compressed layer on disk with its digests.
type LayerFile struct {
	Path string
	// Digest is "sha256:HEX" of the compressed file, DiffID of the tar inside.
	Digest, DiffID string
	Size           int64
}

// WriteLayer writes the tree at root as a gzip-compressed tar layer to path: entries
// in the lexical order filepath.WalkDir gives (a directory before its contents), names
// relative without "./", owners by number only (no names from the build host's
// passwd), mtimes clamped to epoch and nothing else of the build host's clock, hard
// links to the first path of each inode in that order. Extended attributes are not
// written. The contents of EmptiedDirs are left out.
func WriteLayer(root, path string, epoch time.Time) (*LayerFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zh, th := sha256.New(), sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, zh)}
	zw, err := gzip.NewWriterLevel(cw, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(io.MultiWriter(zw, th))
	if err := writeTree(tw, root, epoch.UTC().Truncate(time.Second)); err != nil {
		return nil, fmt.Errorf("layer of %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return &LayerFile{Path: path, Digest: "sha256:" + hex.EncodeToString(zh.Sum(nil)),
		DiffID: "sha256:" + hex.EncodeToString(th.Sum(nil)), Size: cw.n}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type inode struct{ dev, ino uint64 }

func writeTree(tw *tar.Writer, root string, epoch time.Time) error {
	emptied := map[string]bool{}
	for _, d := range EmptiedDirs {
		emptied[d] = true
	}
	links := map[inode]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr, err := header(p, rel, fi, epoch, links)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			if err := copyFile(tw, p, hdr.Size); err != nil {
				return err
			}
		}
		if fi.IsDir() && emptied[rel] {
			return filepath.SkipDir
		}
		return nil
	})
}

// header is the tar header of one file, made from its mode, owner numbers and
// clamped mtime only.
func header(p, rel string, fi os.FileInfo, epoch time.Time, links map[inode]string) (*tar.Header, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%s: no stat data", p)
	}
	mt := fi.ModTime().UTC().Truncate(time.Second)
	if mt.After(epoch) {
		mt = epoch
	}
	m := fi.Mode()
	mode := int64(m.Perm())
	if m&os.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	h := &tar.Header{Name: rel, Mode: mode, Uid: int(st.Uid), Gid: int(st.Gid), ModTime: mt, Format: tar.FormatPAX}
	switch {
	case m.IsDir():
		h.Typeflag, h.Name = tar.TypeDir, rel+"/"
	case m&os.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return nil, err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	case m.IsRegular():
		key := inode{uint64(st.Dev), st.Ino}
		if first, ok := links[key]; ok && st.Nlink > 1 {
			h.Typeflag, h.Linkname = tar.TypeLink, first
			return h, nil
		}
		if st.Nlink > 1 {
			links[key] = rel
		}
		h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	case m&os.ModeNamedPipe != 0:
		h.Typeflag = tar.TypeFifo
	case m&os.ModeDevice != 0:
		h.Typeflag = tar.TypeBlock
		if m&os.ModeCharDevice != 0 {
			h.Typeflag = tar.TypeChar
		}
		h.Devmajor, h.Devminor = int64(unixMajor(st.Rdev)), int64(unixMinor(st.Rdev))
	default:
		return nil, fmt.Errorf("%s: cannot put a %s in a layer", p, strings.ToLower(m.Type().String()))
	}
	return h, nil
}

func unixMajor(dev uint64) uint32 { return uint32((dev>>8)&0xfff) | uint32((dev>>32)&^0xfff) }
func unixMinor(dev uint64) uint32 { return uint32(dev&0xff) | uint32((dev>>12)&^0xff) }

// copyFile copies exactly size bytes of p: a file that changed size while the layer
// was written is an error, not a corrupt layer.
func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: read %d bytes, expected %d", p, n, size)
	}
	return err
}
