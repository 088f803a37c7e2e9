package qemu

import (
	"fmt"
	"io"
)

// cpioEntry is one member of a "newc" cpio archive, the initramfs format
// the kernel unpacks (Documentation/driver-api/early-userspace/buffer-format.rst).
type cpioEntry struct {
	Name       string
	Mode       uint32 // type and permission bits, as in stat(2)
	Data       []byte
	RMaj, RMin uint32 // device numbers of a device node
}

// Mode type bits.
const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioChar = 0o020000
)

// writeCPIO writes entries and the trailer to w.
func writeCPIO(w io.Writer, entries []cpioEntry) error {
	pad := func(n int) error {
		if n%4 == 0 {
			return nil
		}
		_, err := w.Write(make([]byte, 4-n%4))
		return err
	}
	write := func(ino int, e cpioEntry) error {
		nlink := 1
		if e.Mode&0o170000 == cpioDir {
			nlink = 2
		}
		hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
			ino, e.Mode, 0, 0, nlink, 0, len(e.Data), 0, 0, e.RMaj, e.RMin, len(e.Name)+1, 0)
		if _, err := io.WriteString(w, hdr+e.Name+"\x00"); err != nil {
			return err
		}
		if err := pad(len(hdr) + len(e.Name) + 1); err != nil {
			return err
		}
		if _, err := w.Write(e.Data); err != nil {
			return err
		}
		return pad(len(e.Data))
	}
	for i, e := range entries {
		if err := write(i+1, e); err != nil {
			return err
		}
	}
	return write(0, cpioEntry{Name: "TRAILER!!!"})
}
