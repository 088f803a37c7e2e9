package datadisk

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Wipe erases what identifies the content of d so that Decide finds it Empty: it zeroes
// the disk's first HeadBytes and last TailBytes (partition tables and their backups,
// LVM, RAID and ZFS labels, filesystem superblocks at the start of the disk or of a
// partition at 1 MiB) and has the kernel drop its partitions. The data between stays
// on the disk, unreadable without its metadata; Wipe is not a secure erase.
//
// It is the one function here that writes to a disk it did not make, and its contract
// with its caller (the agent, on an operator's request that gpuboot audited) is:
//
//   - d comes from Discover on this node just now; confirmSerial is the serial the
//     operator typed, which gpuboot recorded with the node and the disk's path. Wipe
//     refuses a disk without a serial, a serial that differs from d's, and a disk whose
//     serial in sysfs is no longer d's (the device name now names another disk).
//   - The device is opened exclusively: a mounted disk, or one held by md, dm (LVM,
//     crypt) or another exclusive opener, is refused with the error; stop that first.
//   - The caller Inspects the disk first and records what was on it with the request,
//     and reports the result; Wipe itself reports nothing.
//   - After Wipe, the next Ensure finds the disk Empty and prepares it; a wipe request
//     is carried out once, not on every heartbeat.
func Wipe(d Disk, confirmSerial string) error {
	switch {
	case d.Serial == "":
		return fmt.Errorf("wipe %s: the disk reports no serial, so the request cannot be confirmed; wipe it by hand (wipefs -a) if it must be", d)
	case confirmSerial != d.Serial:
		return fmt.Errorf("wipe %s: the request's serial %q is not the disk's %q; nothing was written", d, confirmSerial, d.Serial)
	}
	if now := readSerial(d.SysDir); now != d.Serial {
		return fmt.Errorf("wipe %s: sysfs now gives serial %q for %s, not %q; discover the disks again; nothing was written", d, now, d.Name, d.Serial)
	}
	f, err := os.OpenFile(d.Path, os.O_RDWR|unix.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("wipe %s: open for writing: %w (is it mounted, or part of a RAID or LVM volume group? stop that first)", d, err)
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil {
		return fmt.Errorf("wipe %s: size: %w", d, err)
	}
	zero := make([]byte, max(HeadBytes, TailBytes))
	tailOff := max(size-TailBytes, 0)
	for _, r := range [][2]int64{{0, min(size, HeadBytes)}, {tailOff, size - tailOff}} {
		if _, err := f.WriteAt(zero[:r[1]], r[0]); err != nil {
			return fmt.Errorf("wipe %s: zero %d bytes at offset %d: %w", d, r[1], r[0], err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("wipe %s: sync: %w", d, err)
	}
	// A device without partition support (EINVAL) has no partitions to drop.
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("wipe %s: zeroed, but the kernel did not drop the old partitions (BLKRRPART: %w); reboot before preparing it", d, err)
	}
	return nil
}
