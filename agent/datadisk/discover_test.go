package datadisk

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSysfs builds a stand-in for /sys: a devices tree with the directories a kernel
// makes for each disk and /sys/block links to them. It is a named stand-in for the real
// sysfs, which tests cannot populate with NVMe, SATA or SAS disks; TestDiscoverLoopDevice
// reads the real one.
type fakeSysfs struct {
	t    *testing.T
	root string
}

func newFakeSysfs(t *testing.T) *fakeSysfs {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "block"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &fakeSysfs{t: t, root: root}
}

// disk adds a disk at devicePath (relative to /sys/devices) with files (relative to its
// directory, e.g. "queue/logical_block_size").
func (f *fakeSysfs) disk(name, devicePath string, files map[string]string) {
	f.t.Helper()
	dir := filepath.Join(f.root, "devices", devicePath, "block", name)
	defaults := map[string]string{"size": "2048", "queue/logical_block_size": "512", "queue/physical_block_size": "512", "removable": "0", "ro": "0"}
	for k, v := range defaults {
		if _, ok := files[k]; !ok {
			files[k] = v
		}
	}
	for k, v := range files {
		p := filepath.Join(dir, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			f.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
	rel, _ := filepath.Rel(filepath.Join(f.root, "block"), dir)
	if err := os.Symlink(rel, filepath.Join(f.root, "block", name)); err != nil {
		f.t.Fatal(err)
	}
}

func TestDiscoverFakeSysfs(t *testing.T) {
	fs := newFakeSysfs(t)
	fs.disk("nvme0n1", "pci0000:00/0000:00:02.0/0000:01:00.0/nvme/nvme0/nvme0n1", map[string]string{
		"size": "7501476528", "device/model": "SAMSUNG MZQL27T6HBLA-00A07             ", "device/serial": "  S6CKNG0W123456  ",
		"queue/logical_block_size": "4096", "queue/physical_block_size": "4096",
	})
	// A partition as sysfs lists it, inside its disk's directory: not a disk.
	fs.disk("sda", "pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0", map[string]string{
		"size": "937703088", "device/model": "SAMSUNG MZ7L3480", "device/vpd_pg80": "\x00\x80\x00\x0eS5X3NG0R654321",
		"queue/physical_block_size": "4096", "sda1/partition": "1", "sda1/size": "2048",
	})
	fs.disk("sdb", "pci0000:00/0000:00:03.0/0000:02:00.0/host0/port-0:0/end_device-0:0/target0:0:0/0:0:0:0", map[string]string{
		"size": "1000000", "device/model": "AL15SEB120N"})
	fs.disk("sdc", "pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0", map[string]string{
		"size": "1000000", "device/model": "Virtual Media", "removable": "1"})
	fs.disk("vda", "pci0000:00/0000:00:04.0/virtio1", map[string]string{"size": "1000000", "serial": "gpurack-disk-1", "ro": "1"})
	for _, virtual := range []string{"loop0", "ram0", "dm-0", "md127", "zram0", "sr0", "nbd0"} {
		fs.disk(virtual, "virtual/block", map[string]string{"size": "1000"})
	}
	fs.disk("nvme1n1", "pci0000:00/0000:00:02.1/0000:03:00.0/nvme/nvme1/nvme1n1", map[string]string{"size": "0"}) // no medium
	// A partition listed at the top, which a real /sys/block never does but /sys/class/block does.
	fs.disk("nvme0n1p1", "pci0000:00/part", map[string]string{"partition": "1"})

	disks, err := Discover(DiscoverOptions{SysRoot: fs.root, DevRoot: "/dev"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range disks {
		got = append(got, d.Name)
	}
	if strings.Join(got, ",") != "nvme0n1,sda,sdb,sdc,vda" {
		t.Fatalf("discovered %v", got)
	}
	want := []Disk{
		{Name: "nvme0n1", Path: "/dev/nvme0n1", Model: "SAMSUNG MZQL27T6HBLA-00A07", Serial: "S6CKNG0W123456", Size: 7501476528 * 512, Transport: TransportNVMe, LogicalBlockSize: 4096, PhysicalBlockSize: 4096},
		{Name: "sda", Path: "/dev/sda", Model: "SAMSUNG MZ7L3480", Serial: "S5X3NG0R654321", Size: 937703088 * 512, Transport: TransportSATA, LogicalBlockSize: 512, PhysicalBlockSize: 4096},
		{Name: "sdb", Path: "/dev/sdb", Model: "AL15SEB120N", Size: 1000000 * 512, Transport: TransportSAS, LogicalBlockSize: 512, PhysicalBlockSize: 512},
		{Name: "sdc", Path: "/dev/sdc", Model: "Virtual Media", Size: 1000000 * 512, Transport: TransportUSB, LogicalBlockSize: 512, PhysicalBlockSize: 512, Removable: true},
		{Name: "vda", Path: "/dev/vda", Serial: "gpurack-disk-1", Size: 1000000 * 512, Transport: TransportVirtio, LogicalBlockSize: 512, PhysicalBlockSize: 512, ReadOnly: true},
	}
	for i, w := range want {
		g := disks[i]
		g.SysDir = ""
		if g != w {
			t.Errorf("disk %d:\n got  %+v\n want %+v", i, g, w)
		}
	}
	if p, err := partitionDevice(disks[1], 1, "/dev"); err != nil || p != "/dev/sda1" {
		t.Errorf("partition 1 of sda: %q, %v", p, err)
	}
	if _, err := partitionDevice(disks[1], 2, "/dev"); err == nil {
		t.Error("partition 2 of sda: no error")
	}

	withLoop, err := Discover(DiscoverOptions{SysRoot: fs.root, IncludeLoop: true})
	if err != nil || len(withLoop) != 6 || withLoop[0].Name != "loop0" || withLoop[0].Transport != TransportLoop {
		t.Errorf("with IncludeLoop: %+v, %v", withLoop, err)
	}
}

func TestDiscoverRefusesNonsense(t *testing.T) {
	for _, files := range []map[string]string{
		{"size": "lots"},
		{"queue/logical_block_size": "1000"},
		{"queue/physical_block_size": "0"},
	} {
		fs := newFakeSysfs(t)
		fs.disk("nvme0n1", "pci/nvme/nvme0/nvme0n1", files)
		if _, err := Discover(DiscoverOptions{SysRoot: fs.root}); err == nil || !strings.Contains(err.Error(), "nvme0n1") {
			t.Errorf("%v: error %v", files, err)
		}
	}
}

func TestTransportOf(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		want       Transport
	}{
		{"nvme0n1", "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/nvme/nvme0/nvme0n1", TransportNVMe},
		{"sda", "/sys/devices/pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0/block/sda", TransportSATA},
		{"sdb", "/sys/devices/pci0000:00/0000:00:03.0/0000:02:00.0/host0/port-0:0/end_device-0:0/target0:0:0/0:0:0:0/block/sdb", TransportSAS},
		{"sdc", "/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdc", TransportUSB},
		{"sdd", "/sys/devices/pci0000:00/0000:00:05.0/virtio2/host0/target0:0:0/0:0:0:0/block/sdd", TransportVirtio},
		{"sde", "/sys/devices/pci0000:00/0000:00:06.0/host3/target3:0:0/3:0:0:0/block/sde", TransportSCSI},
		{"vda", "/sys/devices/pci0000:00/0000:00:04.0/virtio1/block/vda", TransportVirtio},
		{"mmcblk0", "/sys/devices/platform/mmc0/mmc0:0001/block/mmcblk0", TransportMMC},
		{"loop0", "/sys/devices/virtual/block/loop0", TransportLoop},
		{"xyz0", "/sys/devices/platform/xyz/block/xyz0", TransportUnknown},
	} {
		if got := transportOf(tc.name, tc.path); got != tc.want {
			t.Errorf("transportOf(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
