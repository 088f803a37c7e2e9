package localpv

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XFS project quotas through the kernel's own interfaces, as xfs_quota does: the
// directory's project id and inherit flag through FS_IOC_FSSETXATTR (linux/fs.h), the
// project's block hard limit through quotactl_fd(2) with Q_XSETQLIM
// (linux/dqblk_xfs.h). golang.org/x/sys does not name these, so they are here. No
// xfs_quota process: its exit status does not say whether the limit was set.

// fsxattr is struct fsxattr (linux/fs.h).
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

// fsDiskQuota is struct fs_disk_quota (linux/dqblk_xfs.h); limits in 512-byte blocks.
type fsDiskQuota struct {
	Version      int8
	Flags        int8
	Fieldmask    uint16
	ID           uint32
	BlkHardlimit uint64
	BlkSoftlimit uint64
	InoHardlimit uint64
	InoSoftlimit uint64
	Bcount       uint64
	Icount       uint64
	Itimer       int32
	Btimer       int32
	Iwarns       uint16
	Bwarns       uint16
	ItimerHi     int8
	BtimerHi     int8
	RtbtimerHi   int8
	Padding2     int8
	RtbHardlimit uint64
	RtbSoftlimit uint64
	Rtbcount     uint64
	Rtbtimer     int32
	Rtbwarns     uint16
	Padding3     int16
	Padding4     [8]byte
}

const (
	fsIocFsgetxattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFssetxattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjinherit = 0x00000200
	prjQuota           = 2
	qXGetQuota         = 'X'<<8 + 3
	qXSetQLim          = 'X'<<8 + 4
	fsDquotVersion     = 1
	fsProjQuota        = 2
	fsDqBHard          = 1 << 3
	basicBlock         = 512
)

func qcmd(cmd, typ int) int { return cmd<<8 | typ&0xff }

// Quota sets and reads XFS project quotas. The zero value is the kernel's.
type Quota struct{}

// Limit puts directory dir (on the XFS filesystem mounted at mountPoint) in project
// id, inherited by everything made under it, and limits the project to bytes: a write
// past it fails with ENOSPC.
func (Quota) Limit(mountPoint, dir string, id uint32, bytes int64) error {
	if err := setProject(dir, id); err != nil {
		return err
	}
	return setLimit(mountPoint, id, uint64(bytes))
}

// Clear removes project id's limit (its directory is gone).
func (Quota) Clear(mountPoint string, id uint32) error { return setLimit(mountPoint, id, 0) }

// Used is what project id holds on the filesystem mounted at mountPoint, in bytes.
func (Quota) Used(mountPoint string, id uint32) (int64, error) {
	var q fsDiskQuota
	if err := quotactl(mountPoint, qXGetQuota, id, &q); err != nil {
		if errors.Is(err, unix.ENOENT) { // no usage recorded yet
			return 0, nil
		}
		return 0, err
	}
	return int64(q.Bcount) * basicBlock, nil
}

func setProject(dir string, id uint32) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var a fsxattr
	if err := ioctl(f, fsIocFsgetxattr, &a); err != nil {
		return fmt.Errorf("read the attributes of %s: %w", dir, err)
	}
	a.Projid = id
	a.Xflags |= fsXflagProjinherit
	if err := ioctl(f, fsIocFssetxattr, &a); err != nil {
		return fmt.Errorf("set project %d on %s: %w", id, dir, err)
	}
	return nil
}

func setLimit(mountPoint string, id uint32, bytes uint64) error {
	blocks := (bytes + basicBlock - 1) / basicBlock
	q := fsDiskQuota{Version: fsDquotVersion, Flags: fsProjQuota, Fieldmask: fsDqBHard, ID: id,
		BlkHardlimit: blocks, BlkSoftlimit: 0}
	if err := quotactl(mountPoint, qXSetQLim, id, &q); err != nil {
		hint := ""
		if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
			hint = " (is the filesystem mounted with prjquota, and the kernel built with XFS quota support?)"
		}
		return fmt.Errorf("set the quota of project %d on %s to %d bytes: %w%s", id, mountPoint, bytes, err, hint)
	}
	return nil
}

func ioctl(f *os.File, req uintptr, a *fsxattr) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(unsafe.Pointer(a)))
	if e != 0 {
		return e
	}
	return nil
}

// quotactl is quotactl_fd(2) on the mount point (Linux 5.14 and later): no block
// device path needed.
func quotactl(mountPoint string, cmd int, id uint32, q *fsDiskQuota) error {
	f, err := os.Open(mountPoint)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.Fd(), uintptr(qcmd(cmd, prjQuota)), uintptr(id), uintptr(unsafe.Pointer(q)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
