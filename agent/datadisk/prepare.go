package datadisk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MinDiskSize is the smallest disk Ensure prepares: mkfs.xfs (xfsprogs 5.19 and later)
// refuses a filesystem of 300 MiB or less, and the partition leaves out the first and
// last MiB. A smaller disk is an error before anything is written.
const MinDiskSize = 320 << 20

// Preparer brings this cluster's data disks to mounted.
type Preparer struct {
	Cluster ClusterID
	// MountRoot is where each disk is mounted, at MountRoot/<partition GUID in lower
	// case> ("" is DefaultMountRoot). Tests pass a temporary directory.
	MountRoot string
	// DevRoot is where the kernel's partition device nodes appear ("" is /dev).
	DevRoot string
	// PartitionWait bounds the wait for the partition's device node after the table
	// is written (0 is 10 s).
	PartitionWait time.Duration
	// Mount mounts the data partition; nil is the mount(2) system call in this
	// process's mount namespace (tests). The agent passes SystemdMount, so that the
	// mount is the host's.
	Mount MountFunc
	// withoutQuota mounts without prjquota. Only tests set it, on a kernel built without
	// XFS quota support, to exercise everything else.
	withoutQuota bool
}

// Result is what Ensure did with one disk.
type Result struct {
	// Verdict is what the disk was when Ensure looked at it.
	Verdict Verdict
	// Partitioned and Formatted say whether this call wrote the GPT and made the
	// filesystem; both false when the disk was already this cluster's.
	Partitioned, Formatted bool
	// Device is the data partition's device node, MountPoint where it is mounted,
	// PartitionGUID the partition's unique GUID (upper case, as the GPT reads; also for
	// a disk this call partitioned, whose Verdict has none).
	Device, MountPoint, PartitionGUID string
}

// RefusedError is Ensure's error for a disk gpurack must not write to.
type RefusedError struct {
	Disk    Disk
	Verdict Verdict
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("data disk %s refused: it holds %s; gpurack writes only to empty disks and its own, so nothing was written (an operator can wipe it through gpuboot, naming the node, the disk and its serial)",
		e.Disk, e.Verdict.Reason())
}

// Ensure brings d to this cluster's data disk, mounted with project quotas, writing
// only what the disk's Verdict allows:
//
//   - Empty: write gpurack's GPT (the device opened exclusively, its first and last
//     MiBs checked blank again first), have the kernel re-read it, Inspect again and
//     go on only if the disk now reads as Ours and unformatted; then as below.
//   - Ours, not formatted: mkfs.xfs on the partition, without -f, so mkfs refuses a
//     partition that holds a signature it knows.
//   - Ours, formatted: nothing is written; the filesystem is mounted as it is.
//   - OtherCluster, Foreign: nothing is written; the error is a *RefusedError.
//
// Mounting is idempotent: a partition already mounted at its mount point is left.
func (p Preparer) Ensure(ctx context.Context, d Disk) (Result, error) {
	if err := p.Cluster.validate(); err != nil {
		return Result{}, err
	}
	ev, err := Inspect(ctx, d)
	if err != nil {
		return Result{}, err
	}
	v := Decide(ev, p.Cluster)
	res := Result{Verdict: v}
	if v.Refused() {
		return res, &RefusedError{Disk: d, Verdict: v}
	}
	if v.State == Empty {
		if ev.Size < MinDiskSize {
			return res, fmt.Errorf("prepare %s: the disk has %d MiB; XFS (mkfs.xfs) needs a filesystem over 300 MiB, so a data disk needs at least %d MiB; nothing was written", d, ev.Size>>20, MinDiskSize>>20)
		}
		if err := writeTable(d, ev.Size, p.Cluster); err != nil {
			return res, fmt.Errorf("prepare %s: %w", d, err)
		}
		res.Partitioned = true
		ev, err := Inspect(ctx, d)
		if err != nil {
			return res, fmt.Errorf("prepare %s: after writing the partition table: %w", d, err)
		}
		if v = Decide(ev, p.Cluster); v.State != Ours || v.Formatted {
			return res, fmt.Errorf("prepare %s: after writing the partition table the disk reads as %v, not as this cluster's blank partition; nothing more was written", d, v)
		}
	}
	dev, err := p.partition(d, v.Partition)
	if err != nil {
		return res, fmt.Errorf("prepare %s: %w", d, err)
	}
	res.Device, res.PartitionGUID = dev, v.Partition.GUID
	if !v.Formatted {
		if err := mkfsXFS(ctx, dev); err != nil {
			return res, fmt.Errorf("prepare %s: %w", d, err)
		}
		res.Formatted = true
	}
	root := p.MountRoot
	if root == "" {
		root = DefaultMountRoot
	}
	res.MountPoint = filepath.Join(root, strings.ToLower(v.Partition.GUID))
	if err := mountXFS(ctx, p.Mount, dev, res.MountPoint, !p.withoutQuota); err != nil {
		return res, fmt.Errorf("prepare %s: %w", d, err)
	}
	return res, nil
}

// writeTable writes gpurack's GPT for cluster on d, which Inspect found empty at size
// bytes, and has the kernel read it.
func writeTable(d Disk, size int64, cluster ClusterID) error {
	// O_EXCL on a block device fails while it is mounted or held by md, dm or another
	// exclusive opener, and keeps them off while it is open.
	f, err := os.OpenFile(d.Path, os.O_RDWR|unix.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("open for writing: %w (is it mounted or in use?)", err)
	}
	defer f.Close()
	if now, err := f.Seek(0, 2); err != nil || now != size {
		return fmt.Errorf("the disk's size changed from %d to %d bytes since it was inspected (%v)", size, now, err)
	}
	// What was blank when inspected must still be: between Inspect and the exclusive open
	// something else could have written.
	head, err := readAt(f, 0, min(size, HeadBytes))
	if err != nil {
		return err
	}
	tailOff := max(size-TailBytes, 0)
	tail, err := readAt(f, tailOff, size-tailOff)
	if err != nil {
		return err
	}
	if off, ok := firstNonZero(head, 0, 0); ok {
		return fmt.Errorf("data appeared at offset %d since the disk was inspected; nothing was written", off)
	}
	if off, ok := firstNonZero(tail, 0, tailOff); ok {
		return fmt.Errorf("data appeared at offset %d since the disk was inspected; nothing was written", off)
	}
	lbs := d.LogicalBlockSize
	if lbs == 0 {
		lbs = 512
	}
	table, err := newTable(size, lbs, max(d.PhysicalBlockSize, lbs), cluster)
	if err != nil {
		return err
	}
	if err := table.Write(f, size); err != nil {
		return fmt.Errorf("write the partition table: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync the partition table: %w", err)
	}
	return rereadPartitions(f)
}

// rereadPartitions asks the kernel to read f's partition table again (BLKRRPART).
func rereadPartitions(f *os.File) error {
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0); err != nil {
		return fmt.Errorf("the kernel did not re-read the partition table (BLKRRPART: %w); a loop device needs partition scanning (losetup -P)", err)
	}
	return nil
}

// partition returns the device node of d's data partition once the kernel lists it and
// agrees with the table on where it starts and how large it is. A kernel that has not
// listed it (one built without a GPT parser, CONFIG_EFI_PARTITION off, as on some test
// machines) is told where it is with BLKPG_ADD_PARTITION, as partx(8) does; that changes
// the kernel's view only, nothing on the disk.
func (p Preparer) partition(d Disk, part Partition) (string, error) {
	devRoot, wait := p.DevRoot, p.PartitionWait
	if devRoot == "" {
		devRoot = "/dev"
	}
	if wait == 0 {
		wait = 10 * time.Second
	}
	if _, err := partitionDevice(d, part.Index, devRoot); err != nil {
		if err := addPartition(d, part); err != nil {
			return "", err
		}
	}
	deadline := time.Now().Add(wait)
	for {
		dev, err := partitionDevice(d, part.Index, devRoot)
		if err == nil {
			if _, err = os.Stat(dev); err == nil {
				return dev, checkKernelPartition(d, dev, part)
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("partition %d has no device node after %v: %w", part.Index, wait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// addPartition tells the kernel about part of d (BLKPG_ADD_PARTITION, linux/blkpg.h).
func addPartition(d Disk, part Partition) error {
	f, err := os.Open(d.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	bp := unix.BlkpgPartition{Start: part.Start, Length: part.Size, Pno: int32(part.Index)}
	arg := unix.BlkpgIoctlArg{Op: unix.BLKPG_ADD_PARTITION, Datalen: int32(unsafe.Sizeof(bp)), Data: (*byte)(unsafe.Pointer(&bp))}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKPG, uintptr(unsafe.Pointer(&arg))); errno != 0 {
		return fmt.Errorf("the kernel lists no partition %d, and adding it (BLKPG) failed: %w", part.Index, errno)
	}
	return nil
}

// checkKernelPartition compares the kernel's idea of partition dev (sysfs, 512-byte
// sectors) with the table's.
func checkKernelPartition(d Disk, dev string, part Partition) error {
	dir := filepath.Join(d.SysDir, filepath.Base(dev))
	start, err := readInt(filepath.Join(dir, "start"))
	if err != nil {
		return err
	}
	size, err := readInt(filepath.Join(dir, "size"))
	if err != nil {
		return err
	}
	if start*512 != part.Start || size*512 != part.Size {
		return fmt.Errorf("the kernel has %s at %d bytes for %d, the table says %d for %d; re-read the partition table (partprobe) or reboot", dev, start*512, size*512, part.Start, part.Size)
	}
	return nil
}

// mkfsXFS makes gpurack's XFS filesystem on dev. Without -f, mkfs.xfs refuses a device
// that holds a filesystem or partition table it recognises: a second check after Decide.
func mkfsXFS(ctx context.Context, dev string) error {
	cmd := exec.CommandContext(ctx, "mkfs.xfs", "-q", "-L", FilesystemLabel, dev)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return errors.New("mkfs.xfs is not in PATH; it is in xfsprogs, which the image must carry")
		}
		return fmt.Errorf("mkfs.xfs %s: %w: %s", dev, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// mountXFS mounts dev at target with project quotas (prjquota, when quota is set),
// nosuid and nodev, unless it is mounted there already, and checks that project quotas
// are on.
func mountXFS(ctx context.Context, mount MountFunc, dev, target string, quota bool) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	mounted, err := mountedAt(dev, target)
	if err != nil {
		return err
	}
	data := ""
	if quota {
		data = "prjquota"
	}
	if !mounted && mount != nil {
		if err := mount(ctx, dev, target, "xfs", strings.TrimSuffix("nosuid,nodev,"+data, ",")); err != nil {
			return err
		}
		if mounted, err = mountedAt(dev, target); err != nil || !mounted {
			return fmt.Errorf("mounted %s at %s, but this process does not see it there (%v): is its mount namespace cut off from the host's?", dev, target, err)
		}
	}
	if !mounted {
		if err := unix.Mount(dev, target, "xfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
			hint := ""
			if errors.Is(err, unix.EINVAL) && quota {
				hint = "; a kernel built without XFS quota support (CONFIG_XFS_QUOTA) refuses prjquota, and the kernel log says which"
			}
			return fmt.Errorf("mount %s at %s with %q: %w%s", dev, target, data, err, hint)
		}
	}
	if !quota {
		return nil
	}
	opts, err := superOptions(target)
	if err != nil {
		return err
	}
	if !strings.Contains(","+opts+",", ",prjquota,") {
		return fmt.Errorf("%s is mounted at %s without project quotas (options %q); unmount it and run again", dev, target, opts)
	}
	return nil
}

// mountedAt reports whether target is the root of a mount of dev.
func mountedAt(dev, target string) (bool, error) {
	var devSt, targetSt, parentSt unix.Stat_t
	if err := unix.Stat(dev, &devSt); err != nil {
		return false, fmt.Errorf("stat %s: %w", dev, err)
	}
	if err := unix.Stat(target, &targetSt); err != nil {
		return false, fmt.Errorf("stat %s: %w", target, err)
	}
	if err := unix.Stat(filepath.Dir(target), &parentSt); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(target), err)
	}
	return targetSt.Dev == devSt.Rdev && parentSt.Dev != targetSt.Dev, nil
}

// superOptions returns the filesystem options of the mount at target, from
// /proc/self/mountinfo (proc(5): the field after the filesystem type and source).
func superOptions(target string) (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	found, opts := false, ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+3 >= len(fields) {
			continue
		}
		if unescapeMountinfo(fields[4]) == target {
			found, opts = true, fields[sep+3] // the last mount on top wins
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("%s is not a mount point", target)
	}
	return opts, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) of a mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Unmount unmounts the data disk mounted at mountPoint, for tests and for a node being
// decommissioned. EINVAL (not mounted) is not an error.
func Unmount(mountPoint string) error {
	if err := unix.Unmount(mountPoint, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("unmount %s: %w", mountPoint, err)
	}
	return nil
}
