package datadisk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Disk is a whole block device as sysfs describes it. Discover fills it; the rest of
// the package reads it.
type Disk struct {
	Name      string    // kernel name, e.g. nvme0n1
	Path      string    // device node, e.g. /dev/nvme0n1
	Model     string    // spaces trimmed; "" when the device has none (virtio)
	Serial    string    // spaces trimmed; "" when sysfs has none (see Wipe)
	Size      int64     // bytes
	Transport Transport // TransportUnknown when the sysfs path says nothing known
	// LogicalBlockSize is the smallest unit the disk addresses (512, or 4096 on a 4Kn
	// drive): the GPT's sector. PhysicalBlockSize is what it writes internally.
	LogicalBlockSize, PhysicalBlockSize int
	Removable, ReadOnly                 bool
	// SysDir is the disk's directory in sysfs, where Ensure finds its partitions and
	// Wipe reads its serial again.
	SysDir string
}

func (d Disk) String() string {
	s := d.Path
	if d.Model != "" {
		s += " (" + d.Model
		if d.Serial != "" {
			s += ", serial " + d.Serial
		}
		s += ")"
	}
	return s
}

// DiscoverOptions say where Discover reads and what it includes.
type DiscoverOptions struct {
	// SysRoot is where sysfs is mounted ("" is /sys). Tests pass a fake tree.
	SysRoot string
	// DevRoot is the directory of device nodes ("" is /dev).
	DevRoot string
	// IncludeLoop includes attached loop devices, which are otherwise left out like
	// ram, dm, md, zram, nbd, optical and floppy devices. Only tests set it.
	IncludeLoop bool
}

// excludedPrefixes are kernel names that are never data disks: virtual devices, or
// devices built on other disks (dm: LVM and crypt; md: RAID).
var excludedPrefixes = []string{"loop", "ram", "dm-", "md", "zram", "nbd", "sr", "fd", "zd", "rbd", "drbd"}

// Discover lists the whole disks in SysRoot/block, sorted by name: not partitions, not
// the virtual devices excludedPrefixes names, not devices without a medium (size 0).
func Discover(opts DiscoverOptions) ([]Disk, error) {
	sysRoot, devRoot := opts.SysRoot, opts.DevRoot
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	if devRoot == "" {
		devRoot = "/dev"
	}
	blockDir := filepath.Join(sysRoot, "block")
	entries, err := os.ReadDir(blockDir)
	if err != nil {
		return nil, fmt.Errorf("discover disks: %w", err)
	}
	var disks []Disk
	for _, e := range entries {
		name := e.Name()
		if excluded(name, opts.IncludeLoop) {
			continue
		}
		dir := filepath.Join(blockDir, name)
		if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
			continue // a partition listed at the top (not in a real /sys/block)
		}
		d, err := readDisk(dir, name, devRoot)
		if err != nil {
			return nil, fmt.Errorf("discover disks: %s: %w", name, err)
		}
		if d.Size == 0 {
			continue
		}
		disks = append(disks, d)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })
	return disks, nil
}

func excluded(name string, includeLoop bool) bool {
	for _, p := range excludedPrefixes {
		if strings.HasPrefix(name, p) {
			return !(p == "loop" && includeLoop)
		}
	}
	return false
}

func readDisk(dir, name, devRoot string) (Disk, error) {
	d := Disk{Name: name, Path: filepath.Join(devRoot, name), SysDir: dir}
	sectors, err := readInt(filepath.Join(dir, "size"))
	if err != nil {
		return Disk{}, err
	}
	d.Size = sectors * 512 // sysfs counts 512-byte sectors whatever the block size
	if d.LogicalBlockSize, err = readBlockSize(filepath.Join(dir, "queue", "logical_block_size")); err != nil {
		return Disk{}, err
	}
	if d.PhysicalBlockSize, err = readBlockSize(filepath.Join(dir, "queue", "physical_block_size")); err != nil {
		return Disk{}, err
	}
	d.Removable = readFlag(filepath.Join(dir, "removable"))
	d.ReadOnly = readFlag(filepath.Join(dir, "ro"))
	d.Model = readTrimmed(filepath.Join(dir, "device", "model"))
	d.Serial = readSerial(dir)
	link, _ := filepath.EvalSymlinks(dir)
	d.Transport = transportOf(name, filepath.ToSlash(link))
	return d, nil
}

// readSerial reads a disk's serial: NVMe and virtio name it in a file; SCSI and SATA
// (through libata's SCSI translation) in VPD page 0x80, a 4-byte header and the serial
// in ASCII. A loop device has none; its backing file stands in, prefixed "loop:", so
// tests can exercise Wipe's confirmation on one.
func readSerial(dir string) string {
	for _, f := range []string{"device/serial", "serial"} {
		if s := readTrimmed(filepath.Join(dir, f)); s != "" {
			return s
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "device", "vpd_pg80")); err == nil && len(b) > 4 {
		n := int(b[2])<<8 | int(b[3])
		if n > len(b)-4 {
			n = len(b) - 4
		}
		return strings.TrimSpace(strings.Trim(string(b[4:4+n]), "\x00"))
	}
	if s := readTrimmed(filepath.Join(dir, "loop", "backing_file")); s != "" {
		return "loop:" + s
	}
	return ""
}

// transportOf says how disk name is attached from the path its /sys/block link resolves
// to, e.g. /sys/devices/pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0/block/sda.
func transportOf(name, devicePath string) Transport {
	has := func(s string) bool { return strings.Contains(devicePath, s) }
	switch {
	case strings.HasPrefix(name, "loop"):
		return TransportLoop
	case strings.HasPrefix(name, "nvme") || has("/nvme/"):
		return TransportNVMe
	case strings.HasPrefix(name, "vd"):
		return TransportVirtio
	case strings.HasPrefix(name, "mmcblk"):
		return TransportMMC
	case has("/usb"):
		return TransportUSB
	case has("/ata"):
		return TransportSATA
	case has("/end_device-") || has("/sas_"):
		return TransportSAS
	case has("/virtio"):
		return TransportVirtio // virtio-scsi
	case has("/target"):
		return TransportSCSI
	}
	return TransportUnknown
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: %q is not a count", path, strings.TrimSpace(string(b)))
	}
	return n, nil
}

func readBlockSize(path string) (int, error) {
	n, err := readInt(path)
	if err != nil {
		return 0, err
	}
	if n < 512 || n > 1<<16 || n&(n-1) != 0 {
		return 0, fmt.Errorf("%s: block size %d is not a power of two from 512 to 64 KiB", path, n)
	}
	return int(n), nil
}

func readFlag(path string) bool {
	return readTrimmed(path) == "1"
}

// partitionDevice returns the device node of partition number n of d, as the kernel
// lists it in d's sysfs directory (nvme0n1p1, sda1, loop0p1), or an error naming what
// is missing.
func partitionDevice(d Disk, n int, devRoot string) (string, error) {
	entries, err := os.ReadDir(d.SysDir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), d.Name) {
			continue
		}
		num, err := readInt(filepath.Join(d.SysDir, e.Name(), "partition"))
		if err == nil && num == int64(n) {
			return filepath.Join(devRoot, e.Name()), nil
		}
	}
	return "", errors.New("the kernel lists no partition " + strconv.Itoa(n) + " of " + d.Name + " in " + d.SysDir)
}
