// Package sqfs reads squashfs images, such as the rootfs.squashfs that gpuimage builds with
// mksquashfs, in Go: it lists regular files with their sizes and reads a file's content. It
// needs neither squashfs-tools nor root (no loop mount). The decoding is go-diskfs's
// (github.com/diskfs/go-diskfs/filesystem/squashfs); the image file is opened read-only.
// Images compressed with zstd (what gpuimage builds), gzip or xz are read correctly; go-diskfs
// v1.9.4 fails on mksquashfs's lz4 images and on some lzo data blocks, with an error.
//
// A corrupt or truncated image gives an error, never a panic, an endless loop or a huge
// allocation: go-diskfs indexes its tables with values read from the image, and some corrupt
// inputs make it panic (index out of range, slice bounds out of range), so every call into it
// here recovers and reports the panic as an error; reads it keeps making past the end of the
// image, zstd blocks that announce more than a block can hold (the decoder would allocate
// it, up to 64 GiB), and directory loops are stopped and reported the same way.
package sqfs

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/squashfs"
	"github.com/klauspost/compress/zstd"
)

// MaxReadFile is the largest file ReadFile returns; it is meant for small files such as the
// dpkg database, and the limit keeps a corrupt inode from asking for an absurd allocation.
const MaxReadFile = 256 << 20

// maxDepth bounds the directory nesting Walk follows: a Linux path is at most 4096 bytes, so
// a real tree is never deeper than 2048 levels ("/a" each).
const maxDepth = 2048

// ErrCorrupt is wrapped by the errors that come from a malformed image: a panic inside the
// squashfs decoder, a directory loop, a directory entry with an impossible name.
var ErrCorrupt = errors.New("corrupt squashfs image")

// File is one regular file of an image.
type File struct {
	Path string // absolute inside the image, e.g. "/usr/bin/kubelet"
	Size int64  // bytes
}

// Image is a squashfs image opened read-only. It is not safe for concurrent use.
type Image struct {
	name  string
	guard *guard
	fs    *squashfs.FileSystem
}

// Open opens the squashfs image in the file name, read-only, and reads its superblock and
// tables. Close it when done.
func Open(name string) (*Image, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", name)
	}
	im, err := open(file.New(f, true), st.Size(), name)
	if err != nil {
		f.Close()
		return nil, err
	}
	return im, nil
}

// guard is the image file as go-diskfs reads it, and stops two things a corrupt image can
// make go-diskfs do, by panicking (recoverAs turns the panic into an error):
//
//   - Read past the end of the image for ever: go-diskfs ignores a failed read of a metadata
//     block's header and then steps through "empty" blocks. A read past the end fails
//     (io.EOF) as from the file itself; after maxPastEnd of them, which a valid image never
//     causes, guard stops it.
//   - Allocate what a zstd frame header announces: the zstd decoder go-diskfs uses allocates
//     the frame's declared content size up front, up to 64 GiB, so a few corrupt bytes can
//     exhaust memory, which no recover() survives. guard bounds what each zstd block it
//     hands out can decode to: 8 KiB for a metadata block (its squashfs maximum), MaxReadFile
//     for a file's data while Image.read reads it.
type guard struct {
	backend.Storage
	size    int64
	pastEnd int
	zstd    bool  // the image is zstd-compressed
	content bool  // Image.read is reading a file's data blocks
	metaAt  int64 // the offset and length of the compressed metadata block whose 2-byte
	metaLen int   // header was read last (metaLen -1: none)
}

const (
	maxPastEnd        = 1000
	metadataBlockSize = 8192 // squashfs: a metadata block holds at most 8 KiB
	compressionZstd   = 6    // squashfs superblock compression id
)

type readingPastEnd struct{ off, size int64 }

type zstdTooLarge struct {
	off          int64
	bound, limit uint64
}

func (g *guard) ReadAt(p []byte, off int64) (int, error) {
	if off >= g.size && len(p) > 0 {
		if g.pastEnd++; g.pastEnd > maxPastEnd {
			panic(readingPastEnd{off, g.size})
		}
		return 0, io.EOF
	}
	n, err := g.Storage.ReadAt(p, off)
	if g.zstd && n > 0 {
		var limit uint64
		switch {
		case off == g.metaAt && n == g.metaLen:
			limit = metadataBlockSize
		case g.content:
			limit = MaxReadFile
		}
		if limit > 0 {
			if bound := zstdBound(p[:n]); bound > limit {
				panic(zstdTooLarge{off, bound, limit})
			}
		}
	}
	g.metaLen = -1
	if len(p) == 2 && n == 2 {
		// a metadata block header: bit 15 set means stored uncompressed
		if h := int(p[0]) | int(p[1])<<8; h&0x8000 == 0 {
			g.metaAt, g.metaLen = off+2, h&0x7fff
		}
	}
	return n, err
}

// zstdBound is an upper bound of what the zstd decoder allocates and produces for b, a run
// of zstd frames: per frame its declared content size (the decoder allocates that and fails
// past it), or without one the sum of what its blocks can regenerate. The walk stops where
// the frames stop parsing; the decoder fails there too, before allocating for that frame.
func zstdBound(b []byte) uint64 {
	const maxBlock = 128 << 10 // a compressed zstd block regenerates at most 128 KiB
	var total uint64
	for len(b) > 0 {
		var h zstd.Header
		if h.Decode(b) != nil || h.HeaderSize <= 0 || h.HeaderSize > len(b) {
			return total
		}
		if h.Skippable {
			if uint64(h.SkippableSize) > uint64(len(b)-h.HeaderSize) {
				return total
			}
			b = b[h.HeaderSize+int(h.SkippableSize):]
			continue
		}
		var blocks uint64
		p, last := h.HeaderSize, false
		for !last && p+3 <= len(b) {
			bh := int(b[p]) | int(b[p+1])<<8 | int(b[p+2])<<16
			last = bh&1 == 1
			size := bh >> 3
			p += 3
			switch (bh >> 1) & 3 {
			case 0: // raw
				blocks += uint64(size)
				p += size
			case 1: // RLE: one byte, repeated size times
				blocks += uint64(size)
				p++
			case 2: // compressed
				blocks += maxBlock
				p += size
			default: // reserved: the decoder stops with an error
				last = true
			}
		}
		if h.HasFCS {
			total += h.FrameContentSize
		} else {
			total += blocks
		}
		if !last || p > len(b) {
			return total
		}
		if h.HasCheckSum {
			p += 4
		}
		if p >= len(b) {
			return total
		}
		b = b[p:]
	}
	return total
}

// open reads the image from st, which holds size bytes; name is only for messages.
func open(st backend.Storage, size int64, name string) (im *Image, err error) {
	defer recoverAs(&err, name, "")
	g := &guard{Storage: st, size: size, metaLen: -1}
	sb := make([]byte, 22)
	if n, _ := st.ReadAt(sb, 0); n == len(sb) && string(sb[:4]) == "hsqs" {
		g.zstd = int(sb[20])|int(sb[21])<<8 == compressionZstd
	}
	fsys, err := squashfs.Read(g, size, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: not a readable squashfs image: %w", name, err)
	}
	return &Image{name: name, guard: g, fs: fsys}, nil
}

// Close releases the image file.
func (im *Image) Close() error {
	return im.guard.Close()
}

// onPanic, when set (by tests), sees each panic that recoverAs turns into an error.
var onPanic func(r any)

// recoverAs turns a panic inside go-diskfs into an error wrapping ErrCorrupt.
func recoverAs(err *error, image, p string) {
	if r := recover(); r != nil {
		if onPanic != nil {
			onPanic(r)
		}
		where := image
		if p != "" {
			where += ": " + p
		}
		switch e := r.(type) {
		case readingPastEnd:
			*err = fmt.Errorf("%s: %w: still reading past its end (offset %d of %d bytes) after %d tries", where, ErrCorrupt, e.off, e.size, maxPastEnd)
		case zstdTooLarge:
			*err = fmt.Errorf("%s: %w: the zstd data at offset %d can decode to %d bytes, more than the %d it may hold", where, ErrCorrupt, e.off, e.bound, e.limit)
		default:
			*err = fmt.Errorf("%s: %w (the squashfs decoder panicked: %v)", where, ErrCorrupt, r)
		}
	}
}

// rel turns "/var/lib/dpkg/status" or "var/lib/dpkg/status" into the io/fs form go-diskfs
// takes, "var/lib/dpkg/status"; the root is ".".
func rel(p string) string {
	p = path.Clean("/" + p)
	if p == "/" {
		return "."
	}
	return p[1:]
}

// readDir lists the directory dir (io/fs form), its entries checked for impossible names.
func (im *Image) readDir(dir string) (entries []iofs.DirEntry, err error) {
	defer recoverAs(&err, im.name, "/"+strings.TrimPrefix(dir, "."))
	entries, err = im.fs.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", im.name, err)
	}
	for _, e := range entries {
		if n := e.Name(); n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\x00") {
			return nil, fmt.Errorf("%s: /%s: %w: directory entry named %q", im.name, strings.TrimPrefix(dir, "."), ErrCorrupt, n)
		}
	}
	return entries, nil
}

// info is e.Info() under recoverAs; inode is the squashfs inode number, for loop detection.
func (im *Image) info(e iofs.DirEntry, p string) (fi iofs.FileInfo, inode uint32, err error) {
	defer recoverAs(&err, im.name, p)
	fi, err = e.Info()
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %s: %w", im.name, p, err)
	}
	if st, ok := fi.Sys().(*squashfs.StatT); ok {
		inode = st.Inode
	}
	return fi, inode, nil
}

// Walk calls fn for every regular file in the image, depth first with each directory's
// entries in name order (the order of filepath.WalkDir on the unpacked tree). Symbolic links, directories, devices, FIFOs and sockets are
// not regular files and are skipped; a hard-linked file is reported at each of its paths.
// An error from fn stops the walk and is returned.
func (im *Image) Walk(fn func(File) error) error {
	seen := map[uint32]bool{}
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		if depth > maxDepth {
			return fmt.Errorf("%s: /%s: %w: directories nested more than %d deep", im.name, dir, ErrCorrupt, maxDepth)
		}
		entries, err := im.readDir(dir)
		if err != nil {
			return err
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			p := e.Name()
			if dir != "." {
				p = dir + "/" + p
			}
			fi, inode, err := im.info(e, "/"+p)
			if err != nil {
				return err
			}
			switch {
			case fi.Mode().IsRegular():
				if err := fn(File{Path: "/" + p, Size: fi.Size()}); err != nil {
					return err
				}
			case fi.Mode().IsDir():
				if seen[inode] {
					return fmt.Errorf("%s: /%s: %w: directory loop (inode %d listed twice)", im.name, p, ErrCorrupt, inode)
				}
				seen[inode] = true
				if err := walk(p, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(".", 0)
}

// Files returns every regular file in the image, in the order Walk visits them. On an error
// it returns the files listed before it, and the error.
func (im *Image) Files() ([]File, error) {
	var files []File
	err := im.Walk(func(f File) error {
		files = append(files, f)
		return nil
	})
	return files, err
}

// LargestFiles returns the n largest regular files, largest first (ties by path), and how
// many regular files the image holds in all.
func (im *Image) LargestFiles(n int) (largest []File, count int, err error) {
	files, err := im.Files()
	if err != nil {
		return nil, 0, err
	}
	sort.Slice(files, func(i, j int) bool {
		return files[i].Size > files[j].Size || files[i].Size == files[j].Size && files[i].Path < files[j].Path
	})
	if n < 0 {
		n = 0
	}
	if n > len(files) {
		n = len(files)
	}
	return files[:n:n], len(files), nil
}

// ReadFile returns the content of the regular file at p ("/var/lib/dpkg/status"; the
// leading slash is optional). A symbolic link is not followed: it is an error, as is a file
// larger than MaxReadFile.
func (im *Image) ReadFile(p string) ([]byte, error) {
	r := rel(p)
	shown := "/" + strings.TrimPrefix(r, ".")
	if r == "." {
		return nil, fmt.Errorf("%s: /: is a directory", im.name)
	}
	entries, err := im.readDir(path.Dir(r))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Name() != path.Base(r) {
			continue
		}
		fi, _, err := im.info(e, shown)
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: %s: not a regular file (%s)", im.name, shown, fi.Mode().Type())
		}
		if fi.Size() > MaxReadFile {
			return nil, fmt.Errorf("%s: %s: %d bytes, more than the %d this reads", im.name, shown, fi.Size(), MaxReadFile)
		}
		return im.read(e, fi.Size(), shown)
	}
	return nil, fmt.Errorf("%s: %s: %w", im.name, shown, iofs.ErrNotExist)
}

// read reads the size bytes of the file behind e into one buffer of that size: go-diskfs's
// File.Read walks the file's block list from the start on each call, so reading in many
// small pieces (io.ReadAll) would be quadratic.
func (im *Image) read(e iofs.DirEntry, size int64, shown string) (data []byte, err error) {
	defer recoverAs(&err, im.name, shown)
	im.guard.content = true
	defer func() { im.guard.content = false }()
	o, ok := e.(interface {
		Open() (filesystem.File, error)
	})
	if !ok {
		return nil, fmt.Errorf("%s: %s: cannot open (%T)", im.name, shown, e)
	}
	f, err := o.Open()
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", im.name, shown, err)
	}
	defer f.Close()
	data = make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", im.name, shown, err)
	}
	return data, nil
}

// ReadFile opens the squashfs image file image and returns the content of the regular file
// p inside it; see Image.ReadFile.
func ReadFile(image, p string) ([]byte, error) {
	im, err := Open(image)
	if err != nil {
		return nil, err
	}
	defer im.Close()
	return im.ReadFile(p)
}

// LargestFiles opens the squashfs image file image and returns its n largest regular files
// and its count of regular files; see Image.LargestFiles.
func LargestFiles(image string, n int) ([]File, int, error) {
	im, err := Open(image)
	if err != nil {
		return nil, 0, err
	}
	defer im.Close()
	return im.LargestFiles(n)
}
