// Package assemble turns a built root filesystem into the image's boot artifacts: the
// squashfs (mksquashfs from squashfs-tools, which honours SOURCE_DATE_EPOCH), the
// initramfs (a reproducible cpio newc archive written here: sorted entries, uid/gid 0,
// fixed mtimes, gzip without a name or time), and the kernel-module closures both need.
package assemble

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// Entry is one file of an initramfs.
type Entry struct {
	// Path is relative to the archive root, without a leading slash.
	Path string
	// Mode holds the type bits (S_IFREG, S_IFDIR, S_IFLNK, S_IFCHR) and permissions.
	Mode uint32
	// Data is the file content, or the link target for a symlink.
	Data []byte
	// Source, if set, is read for the content instead of Data.
	Source string
	// Major and Minor are the device numbers of a character device.
	Major, Minor uint32
}

const (
	ModeDir  = 0o040000
	ModeReg  = 0o100000
	ModeLink = 0o120000
	ModeChr  = 0o020000
)

// WriteCpio writes entries as a gzip-compressed cpio newc archive. Entries are sorted
// by path and their parent directories are added, every mtime is mtime and every owner
// root, and inode numbers are assigned in order, so the same entries give the same bytes.
func WriteCpio(w io.Writer, entries []Entry, mtime int64) error {
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	if err := WriteCpioRaw(gz, entries, mtime); err != nil {
		return err
	}
	return gz.Close()
}

// WriteCpioRaw is WriteCpio without compression, for archives of already compressed
// files (a packed rootfs.squashfs). The kernel unpacks concatenated archives, compressed
// or not, in order.
func WriteCpioRaw(gz io.Writer, entries []Entry, mtime int64) error {
	all := map[string]Entry{}
	for _, e := range entries {
		e.Path = strings.Trim(path.Clean("/"+e.Path), "/")
		all[e.Path] = e
		for d := path.Dir(e.Path); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = Entry{Path: d, Mode: ModeDir | 0o755}
			}
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	var err error
	for i, n := range names {
		e := all[n]
		data := e.Data
		if e.Source != "" {
			if data, err = os.ReadFile(e.Source); err != nil {
				return err
			}
		}
		if e.Mode&0o170000 == ModeDir || e.Mode&0o170000 == ModeChr {
			data = nil
		}
		if err := writeRecord(gz, uint32(i+1), e, n, data, mtime); err != nil {
			return err
		}
	}
	return writeRecord(gz, 0, Entry{}, "TRAILER!!!", nil, 0)
}

func writeRecord(w io.Writer, ino uint32, e Entry, name string, data []byte, mtime int64) error {
	nlink := uint32(1)
	if e.Mode&0o170000 == ModeDir {
		nlink = 2
	}
	if name == "TRAILER!!!" {
		nlink = 1
	}
	var hdr bytes.Buffer
	fmt.Fprintf(&hdr, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, e.Mode, 0, 0, nlink, uint32(mtime), len(data), 0, 0, e.Major, e.Minor, len(name)+1, 0)
	hdr.WriteString(name)
	hdr.WriteByte(0)
	pad(&hdr, hdr.Len())
	hdr.Write(data)
	pad(&hdr, len(data))
	_, err := w.Write(hdr.Bytes())
	return err
}

func pad(b *bytes.Buffer, n int) {
	for n%4 != 0 {
		b.WriteByte(0)
		n++
	}
}

// AppendPacked writes initrd followed by an uncompressed cpio archive holding the file
// rootfs as /rootfs.squashfs, which gpurack-init boots when gpurack.rootfs= is absent
// (single-file boots). The kernel looks for each further archive only at a 4-byte
// aligned offset, so zero padding goes between the two.
func AppendPacked(w io.Writer, initrd io.Reader, rootfs string) error {
	n, err := io.Copy(w, initrd)
	if err != nil {
		return err
	}
	if pad := (4 - n%4) % 4; pad > 0 {
		if _, err := w.Write(make([]byte, pad)); err != nil {
			return err
		}
	}
	return WriteCpioRaw(w, []Entry{{Path: "rootfs.squashfs", Mode: ModeReg | 0o644, Source: rootfs}}, 0)
}
