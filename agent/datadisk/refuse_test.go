package datadisk

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/diskfs/go-diskfs/partition/mbr"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestForeignDisksAreRefusedAndUntouched makes each kind of disk gpurack must not
// write to, the real way where this machine can, and checks that Inspect and Decide
// name what is on it, that Ensure refuses it, and that the whole disk is byte-identical
// afterwards (sha256 of the device).
func TestForeignDisksAreRefusedAndUntouched(t *testing.T) {
	const size = 80 << 20 // blkid probes ZFS only on devices of 64 MiB and more
	for _, tc := range []struct {
		name  string
		fill  func(t *testing.T, image string)
		after func(t *testing.T, dev string) // on the attached device
		state State
		found string
	}{
		{name: "ext4 with a file", fill: func(t *testing.T, image string) {
			testreq.Tool(t, "mkfs.ext4", aptHint)
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "results.csv"), []byte("a,b\n1,2\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			run(t, "mkfs.ext4", "-q", "-F", "-L", "scratch", "-d", dir, image)
		}, state: Foreign, found: `ext4 filesystem (label "scratch")`},
		{name: "LVM physical volume", after: func(t *testing.T, dev string) {
			testreq.Tool(t, "pvcreate", aptHint)
			// No udev and no devices file or hints here: pvcreate writes its label and
			// leaves no state outside the device.
			run(t, "pvcreate", "--devicesfile", "", "--config",
				`devices { obtain_device_list_from_udev = 0 hints = "none" } activation { udev_sync = 0 udev_rules = 0 }`, "-y", dev)
		}, state: Foreign, found: "LVM2 physical volume"},
		{name: "Linux RAID member", fill: writeMDFixture, state: Foreign, found: `Linux RAID member (array "gpurack-fixture:0")`},
		{name: "ZFS member", fill: writeZFSFixture, state: Foreign, found: `ZFS member (pool "tank")`},
		{name: "MBR", fill: func(t *testing.T, image string) {
			writeTableFile(t, image, &mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, Partitions: []*mbr.Partition{
				{Type: mbr.Linux, Start: 2048, Size: 40960}}})
		}, state: Foreign, found: "MBR partition table with 1 partition"},
		{name: "GPT with two partitions", fill: func(t *testing.T, image string) {
			writeTableFile(t, image, &gpt.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512, ProtectiveMBR: true, Partitions: []*gpt.Partition{
				{Index: 1, Start: 2048, Size: 8 << 20, Type: gpt.LinuxFilesystem, Name: "root"},
				{Index: 2, Start: 2048 + 16384, Size: 8 << 20, Type: gpt.LinuxFilesystem, Name: "home"}}})
		}, state: Foreign, found: "GPT partition table with 2 partitions"},
		{name: "gpurack's partition beside another", fill: func(t *testing.T, image string) {
			table, err := newTable(size, 512, 512, testCluster)
			if err != nil {
				t.Fatal(err)
			}
			table.Partitions[0].End = 4095
			table.Partitions = append(table.Partitions, &gpt.Partition{Index: 2, Start: 4096, Size: 8 << 20, Type: gpt.LinuxFilesystem})
			writeTableFile(t, image, table)
		}, state: Foreign, found: "GPT partition table with 2 partitions"},
		{name: "another cluster's", fill: func(t *testing.T, image string) {
			table, err := newTable(size, 512, 512, otherCluster)
			if err != nil {
				t.Fatal(err)
			}
			writeTableFile(t, image, table)
		}, state: OtherCluster, found: "another cluster (fingerprint " + otherCluster.Fingerprint()},
		{name: "unknown bytes", fill: func(t *testing.T, image string) {
			writeAtFile(t, image, 300<<10, []byte("not a signature blkid knows"))
		}, state: Foreign, found: "unknown data at offset 307200"},
		{name: "unknown bytes at the end", fill: func(t *testing.T, image string) {
			writeAtFile(t, image, size-1, []byte{7})
		}, state: Foreign, found: "unknown data at offset 83886079"},
		{name: "ext4 in a partition whose table was zeroed", fill: func(t *testing.T, image string) {
			testreq.Tool(t, "mkfs.ext4", aptHint)
			run(t, "mkfs.ext4", "-q", "-F", "-E", "offset=1048576", image, "16M")
			zeroFirstMiB(t, image)
		}, state: Foreign, found: "ext4 filesystem at offset 1048576"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := loopDisk(t, size, 512, func(image string) {
				if tc.fill != nil {
					tc.fill(t, image)
				}
			})
			if tc.after != nil {
				tc.after(t, d.Path)
			}
			before := sha256Of(t, d.Path)
			ctx := testContext(t)
			ev, err := Inspect(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			v := Decide(ev, testCluster)
			if v.State != tc.state || !strings.Contains(v.Reason(), tc.found) {
				t.Errorf("Decide = %v, want %v with %q", v, tc.state, tc.found)
			}
			p := Preparer{Cluster: testCluster, MountRoot: t.TempDir()}
			res, err := p.Ensure(ctx, d)
			var refused *RefusedError
			if !errors.As(err, &refused) || res.Partitioned || res.Formatted || res.MountPoint != "" {
				t.Errorf("Ensure = %+v, %v; want a refusal", res, err)
			} else if !strings.Contains(err.Error(), tc.found) || !strings.Contains(err.Error(), "nothing was written") {
				t.Errorf("refusal %q does not say what was found and that nothing was written", err)
			}
			if after := sha256Of(t, d.Path); after != before {
				t.Errorf("the disk changed: sha256 %s before, %s after", before, after)
			}
		})
	}
}

// writeTableFile writes a partition table with go-diskfs to the image file.
func writeTableFile(t *testing.T, image string, table interface {
	Write(backend.WritableFile, int64) error
}) {
	t.Helper()
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := table.Write(f, st.Size()); err != nil {
		t.Fatal(err)
	}
}

func writeAtFile(t *testing.T, image string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(image, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func zeroFirstMiB(t *testing.T, image string) {
	writeAtFile(t, image, 0, make([]byte, 1<<20))
}

// writeZFSFixture writes a FIXTURE, not a pool: ZFS cannot be created here (no zfs tools
// in Debian main, no zfs module). It is the least of a ZFS vdev label that blkid's
// probe recognises (util-linux libblkid/src/superblocks/zfs.c): in label L0 at offset
// 0, an nvlist at 16 KiB naming the pool "tank" (XDR: big-endian sizes) and four
// uberblocks with the magic 0x00bab10c (host-endian) at 128 KiB.
func writeZFSFixture(t *testing.T, image string) {
	t.Helper()
	label := make([]byte, 256<<10)
	nv := label[16<<10:]
	// nvlist header (12 bytes), then one nvpair: size, 0, name length, "name" padded to 4,
	// then the value: type 9 (string), 1 element, length, "tank".
	be := binary.BigEndian
	pair := nv[12:]
	be.PutUint32(pair[0:], 32)
	be.PutUint32(pair[8:], 4)
	copy(pair[12:], "name")
	be.PutUint32(pair[16:], 9)
	be.PutUint32(pair[20:], 1)
	be.PutUint32(pair[24:], 4)
	copy(pair[28:], "tank")
	for i := range 4 {
		ub := label[128<<10+i<<10:]
		binary.LittleEndian.PutUint64(ub[0:], 0x00bab10c)
		binary.LittleEndian.PutUint64(ub[8:], 5000) // SPA version
		binary.LittleEndian.PutUint64(ub[16:], uint64(i+1))
	}
	writeAtFile(t, image, 0, label)
}

// writeMDFixture writes a Linux RAID (md) version 1.2 superblock at 4 KiB, as `mdadm
// --create --metadata=1.2` would for a one-device RAID1. It is a FIXTURE because this
// machine's kernel has no md driver, without which mdadm cannot create an array;
// `mdadm --examine` (which checks the superblock's checksum) reads it as a valid member
// before the test relies on it. Layout: linux/include/uapi/linux/raid/md_p.h, struct
// mdp_superblock_1.
func writeMDFixture(t *testing.T, image string) {
	t.Helper()
	testreq.Tool(t, "mdadm", aptHint)
	sb := make([]byte, 256+2) // the fixed part and dev_roles[1]
	le := binary.LittleEndian
	le.PutUint32(sb[0:], 0xa92b4efc) // magic
	le.PutUint32(sb[4:], 1)          // major_version
	copy(sb[16:32], []byte{0x67, 0x70, 0x75, 0x72, 0x61, 0x63, 0x6b, 0x2d, 0x66, 0x69, 0x78, 0x74, 0x75, 0x72, 0x65, 0x31})
	copy(sb[32:64], "gpurack-fixture:0")
	le.PutUint64(sb[64:], 1700000000) // ctime
	le.PutUint32(sb[72:], 1)          // level: RAID1
	le.PutUint64(sb[80:], 2048*30)    // size, 512-byte sectors
	le.PutUint32(sb[92:], 1)          // raid_disks
	le.PutUint64(sb[128:], 2048)      // data_offset
	le.PutUint64(sb[136:], 2048*30)   // data_size
	le.PutUint64(sb[144:], 8)         // super_offset: 4 KiB
	copy(sb[168:184], []byte{0x64, 0x65, 0x76, 0x69, 0x63, 0x65, 0x2d, 0x66, 0x69, 0x78, 0x74, 0x75, 0x72, 0x65, 0x30, 0x31})
	le.PutUint64(sb[192:], 1700000000) // utime
	le.PutUint64(sb[200:], 1)          // events
	le.PutUint64(sb[208:], ^uint64(0)) // resync_offset: in sync
	le.PutUint32(sb[220:], 1)          // max_dev
	le.PutUint16(sb[256:], 0)          // dev_roles[0]: the first device
	var sum uint64                     // mdadm super1.c calc_sb_1_csum
	for i := 0; i+4 <= len(sb); i += 4 {
		sum += uint64(le.Uint32(sb[i:]))
	}
	sum += uint64(le.Uint16(sb[256:]))
	le.PutUint32(sb[216:], uint32(sum&0xffffffff+sum>>32))
	writeAtFile(t, image, 4096, sb)
	out := run(t, "mdadm", "--examine", image)
	if !strings.Contains(out, "Checksum : ") || !strings.Contains(out, "correct") || !strings.Contains(out, "Version : 1.2") {
		t.Fatalf("mdadm does not read the fixture as a valid 1.2 member:\n%s", out)
	}
}
