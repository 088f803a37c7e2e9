package datadisk

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
	"golang.org/x/sys/unix"
)

// preparedSize is large enough for mkfs.xfs (at least 300 MB) and sparse, so it costs
// little.
const preparedSize = 512 << 20

// kernelXFSQuota reports whether the running kernel supports XFS quotas, from its
// configuration (/proc/config.gz or /boot/config-<release>); without either it assumes so.
func kernelXFSQuota(t *testing.T) bool {
	t.Helper()
	var config []byte
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		if z, err := gzip.NewReader(f); err == nil {
			config, _ = io.ReadAll(z)
		}
	} else {
		var uts unix.Utsname
		if unix.Uname(&uts) == nil {
			config, _ = os.ReadFile("/boot/config-" + unix.ByteSliceToString(uts.Release[:]))
		}
	}
	return config == nil || bytes.Contains(config, []byte("\nCONFIG_XFS_QUOTA=y"))
}

// preparer is the Preparer the tests use: mounts under a temporary directory, and
// without prjquota on a kernel that has no XFS quota support, said in the test's log
// (TestProjectQuotaStopsWritesPastItsLimit does not apply there, and
// TestEnsureSaysWhenTheKernelHasNoXFSQuota checks the error a node would see).
func preparer(t *testing.T, cluster ClusterID) Preparer {
	t.Helper()
	p := Preparer{Cluster: cluster, MountRoot: t.TempDir()}
	if !kernelXFSQuota(t) {
		t.Log("this kernel has no XFS quota support (CONFIG_XFS_QUOTA is not set): mounting without prjquota")
		p.withoutQuota = true
	}
	return p
}

// partitionProbe is blkid's probe of dev (a partition): TYPE, UUID, LABEL and the
// PART_ENTRY_* fields of its table entry.
func partitionProbe(t *testing.T, dev string) map[string]string {
	t.Helper()
	fields, err := parseBlkidExport([]byte(run(t, "blkid", "-p", "-o", "export", dev)))
	if err != nil {
		t.Fatal(err)
	}
	return fields
}

func TestEnsurePreparesAnEmptyDiskAndMountsItAgainAsItIs(t *testing.T) {
	for _, sector := range []int{512, 4096} {
		t.Run(strconv.Itoa(sector), func(t *testing.T) {
			d := loopDisk(t, preparedSize, sector, nil)
			ctx := testContext(t)
			p := preparer(t, testCluster)
			res, err := p.Ensure(ctx, d)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = Unmount(res.MountPoint) })
			if res.Verdict.State != Empty || !res.Partitioned || !res.Formatted || res.Device != d.Path+"p1" ||
				res.PartitionGUID == "" || filepath.Base(res.MountPoint) != strings.ToLower(res.PartitionGUID) {
				t.Fatalf("Ensure = %+v; want the new partition's GUID, which names the mount point", res)
			}

			// The GPT counts the disk's own sectors: its header is in the second one.
			head := make([]byte, 2*sector)
			f, err := os.Open(d.Path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.ReadAt(head, 0)
			f.Close()
			if err != nil || !bytes.Equal(head[sector:sector+8], []byte("EFI PART")) {
				t.Errorf("no GPT header at offset %d (%v)", sector, err)
			}
			part := partitionProbe(t, res.Device)
			for k, want := range map[string]string{
				"TYPE": "xfs", "LABEL": FilesystemLabel, "PART_ENTRY_NAME": testCluster.partitionName(),
				"PART_ENTRY_TYPE": strings.ToLower(PartitionType), "PART_ENTRY_NUMBER": "1",
				"PART_ENTRY_OFFSET": strconv.Itoa(DataOffset / 512), // blkid counts 512-byte sectors
			} {
				if part[k] != want {
					t.Errorf("partition %s = %q, want %q", k, part[k], want)
				}
			}
			if want := filepath.Join(p.MountRoot, strings.ToLower(part["PART_ENTRY_UUID"])); res.MountPoint != want {
				t.Errorf("mounted at %s, want %s", res.MountPoint, want)
			}
			fsUUID := part["UUID"]

			// Written before: must survive the next Ensure.
			file := filepath.Join(res.MountPoint, "checkpoint.bin")
			if err := os.WriteFile(file, []byte("epoch 7"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Ensure on the mounted disk changes nothing.
			again, err := p.Ensure(ctx, d)
			if err != nil || again.Verdict.State != Ours || !again.Verdict.Formatted || again.Partitioned || again.Formatted || again.MountPoint != res.MountPoint {
				t.Fatalf("Ensure on the mounted disk = %+v, %v", again, err)
			}
			// As after a reboot: unmounted, the disk is mounted as it is.
			if err := Unmount(res.MountPoint); err != nil {
				t.Fatal(err)
			}
			after, err := p.Ensure(ctx, d)
			if err != nil || after.Verdict.State != Ours || after.Partitioned || after.Formatted {
				t.Fatalf("Ensure after unmounting = %+v, %v", after, err)
			}
			if b, err := os.ReadFile(file); err != nil || string(b) != "epoch 7" {
				t.Errorf("the file written before: %q, %v", b, err)
			}
			if now := partitionProbe(t, res.Device)["UUID"]; now != fsUUID || fsUUID == "" {
				t.Errorf("XFS UUID %q before, %q after: formatted again", fsUUID, now)
			}
		})
	}
}

// TestAnotherClustersPreparedDiskIsRefusedAndUntouched prepares a disk fully for one
// cluster, then has another cluster's Ensure meet it.
func TestAnotherClustersPreparedDiskIsRefusedAndUntouched(t *testing.T) {
	d := loopDisk(t, preparedSize, 512, nil)
	ctx := testContext(t)
	theirs, err := preparer(t, otherCluster).Ensure(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(theirs.MountPoint, "tenant-data"), []byte("theirs"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(theirs.MountPoint); err != nil {
		t.Fatal(err)
	}
	before := sha256Of(t, d.Path)
	res, err := preparer(t, testCluster).Ensure(ctx, d)
	var refused *RefusedError
	if !errors.As(err, &refused) || res.Verdict.State != OtherCluster || !strings.Contains(err.Error(), "another cluster (fingerprint "+otherCluster.Fingerprint()) {
		t.Errorf("Ensure = %+v, %v; want another cluster's refusal", res, err)
	}
	if after := sha256Of(t, d.Path); after != before {
		t.Errorf("the disk changed: sha256 %s before, %s after", before, after)
	}
}

// TestEnsureFinishesAPreparationCutShort: the table was written, mkfs never ran.
func TestEnsureFinishesAPreparationCutShort(t *testing.T) {
	d := loopDisk(t, preparedSize, 4096, func(image string) {
		table, err := newTable(preparedSize, 4096, 4096, testCluster)
		if err != nil {
			t.Fatal(err)
		}
		writeTableFile(t, image, table)
	})
	res, err := preparer(t, testCluster).Ensure(testContext(t), d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(res.MountPoint) })
	if res.Verdict.State != Ours || res.Verdict.Formatted || res.Partitioned || !res.Formatted {
		t.Errorf("Ensure = %+v", res)
	}
}

// TestProjectQuotaStopsWritesPastItsLimit proves the mechanism the provisioner will use
// for a volume's size: a directory given an XFS project (xfs_quota `project -s`) and a
// hard block limit on it; writing past the limit fails with ENOSPC, while a directory
// outside the project takes the same write.
func TestProjectQuotaStopsWritesPastItsLimit(t *testing.T) {
	needDevices(t)
	if !kernelXFSQuota(t) {
		// The host's kernel, not a tool anyone can install: the node image's kernel
		// (Debian's) has it, and the storage tests in the QEMU rig prove it there.
		testreq.NotApplicable(t, "this host's kernel has no XFS quota support (CONFIG_XFS_QUOTA is not set), so nothing can mount XFS with prjquota here; "+
			"a kernel built with CONFIG_XFS_QUOTA=y, such as Debian's linux-image-amd64, runs it")
	}
	d := loopDisk(t, preparedSize, 512, nil)
	res, err := preparer(t, testCluster).Ensure(testContext(t), d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(res.MountPoint) })
	volume := filepath.Join(res.MountPoint, "volumes", "pvc-1")
	free := filepath.Join(res.MountPoint, "outside")
	for _, dir := range []string{volume, free} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const project = "4242"
	run(t, "xfs_quota", "-x", "-c", "project -s -p "+volume+" "+project, res.MountPoint)
	run(t, "xfs_quota", "-x", "-c", "limit -p bhard=1m "+project, res.MountPoint)
	if report := run(t, "xfs_quota", "-x", "-c", "report -p -b -N", res.MountPoint); !strings.Contains(report, "#"+project) {
		t.Fatalf("project %s is not in the quota report:\n%s", project, report)
	}

	write := func(path string, n int) error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		_, err = f.Write(bytes.Repeat([]byte{0xa5}, n))
		if err == nil {
			err = f.Sync()
		}
		return errors.Join(err, f.Close())
	}
	if err := write(filepath.Join(volume, "small"), 512<<10); err != nil {
		t.Fatalf("512 KiB under a 1 MiB limit: %v", err)
	}
	err = write(filepath.Join(volume, "large"), 2<<20)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("2 MiB more under a 1 MiB limit: %v, want ENOSPC", err)
	}
	if err := write(filepath.Join(free, "large"), 2<<20); err != nil {
		t.Errorf("2 MiB outside the project: %v", err)
	}
}

func TestWipeNeedsTheSerialAndThenTheDiskIsPrepared(t *testing.T) {
	d := loopDisk(t, preparedSize, 512, func(image string) {
		testreq.Tool(t, "mkfs.ext4", aptHint)
		run(t, "mkfs.ext4", "-q", "-F", image)
	})
	ctx := testContext(t)
	before := sha256Of(t, d.Path)
	noSerial := d
	noSerial.Serial = ""
	for _, tc := range []struct {
		disk    Disk
		confirm string
		want    string
	}{
		{d, "", "is not the disk's"},
		{d, d.Serial + "x", "is not the disk's"},
		{noSerial, "", "reports no serial"},
		{func() Disk { moved := d; moved.Serial = "loop:/elsewhere.img"; return moved }(), "loop:/elsewhere.img", "discover the disks again"},
	} {
		if err := Wipe(tc.disk, tc.confirm); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Wipe(serial %q, confirm %q) = %v, want %q", tc.disk.Serial, tc.confirm, err, tc.want)
		}
	}
	if after := sha256Of(t, d.Path); after != before {
		t.Fatal("a refused wipe changed the disk")
	}

	if err := Wipe(d, d.Serial); err != nil {
		t.Fatal(err)
	}
	ev, err := Inspect(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	if v := Decide(ev, testCluster); v.State != Empty {
		t.Fatalf("after the wipe: %v", v)
	}
	p := preparer(t, testCluster)
	res, err := p.Ensure(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(res.MountPoint) })
	// A mounted disk is not wiped: the exclusive open fails.
	if err := Wipe(d, d.Serial); err == nil || !strings.Contains(err.Error(), "mounted") {
		t.Errorf("Wipe of a mounted disk: %v", err)
	}
	if ev, err := Inspect(ctx, d); err != nil || Decide(ev, testCluster).State != Ours {
		t.Errorf("after the refused wipe: %v, %v", Decide(ev, testCluster), err)
	}
}

// TestEnsureSaysWhenTheKernelHasNoXFSQuota: on a kernel without XFS quota support the
// mount fails, and the error says why.
func TestEnsureSaysWhenTheKernelHasNoXFSQuota(t *testing.T) {
	needDevices(t)
	if kernelXFSQuota(t) {
		testreq.NotApplicable(t, "this kernel supports XFS quotas, so a prjquota mount cannot fail for the lack of it")
	}
	d := loopDisk(t, preparedSize, 512, nil)
	_, err := Preparer{Cluster: testCluster, MountRoot: t.TempDir()}.Ensure(testContext(t), d)
	if err == nil || !strings.Contains(err.Error(), "CONFIG_XFS_QUOTA") {
		t.Errorf("Ensure = %v, want the mount's error naming CONFIG_XFS_QUOTA", err)
	}
}

// TestEnsureLeavesATooSmallDiskAlone: mkfs.xfs refuses filesystems of 300 MiB or less,
// so a smaller empty disk is an error that says so before anything is written, not a
// partition table followed by a failed mkfs.
func TestEnsureLeavesATooSmallDiskAlone(t *testing.T) {
	d := loopDisk(t, 256<<20, 512, nil)
	before := sha256Of(t, d.Path)
	_, err := Preparer{Cluster: testCluster, MountRoot: t.TempDir()}.Ensure(testContext(t), d)
	if err == nil || !strings.Contains(err.Error(), "needs at least 320 MiB; nothing was written") {
		t.Errorf("Ensure on a 256 MiB disk = %v, want the size refusal", err)
	}
	if after := sha256Of(t, d.Path); after != before {
		t.Error("the too-small disk was written to")
	}
}

// TestEnsureMountsThroughMount: with a Mount function (the agent's is SystemdMount),
// Ensure has it mount the partition, with the options as mount(8) writes them, and
// checks afterwards that the mount is there; one that reports success without
// mounting is an error saying the mount is not seen.
func TestEnsureMountsThroughMount(t *testing.T) {
	d := loopDisk(t, preparedSize, 512, nil)
	p := preparer(t, testCluster)
	var got []string
	p.Mount = func(_ context.Context, dev, target, fstype, options string) error {
		got = append(got, fstype+" "+options)
		data := strings.TrimPrefix(options, "nosuid,nodev")
		return unix.Mount(dev, target, fstype, unix.MS_NOSUID|unix.MS_NODEV, strings.TrimPrefix(data, ","))
	}
	res, err := p.Ensure(testContext(t), d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(res.MountPoint) })
	want := "xfs nosuid,nodev,prjquota"
	if p.withoutQuota {
		want = "xfs nosuid,nodev"
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("Mount called with %q, want [%q]", got, want)
	}
	if err := Unmount(res.MountPoint); err != nil {
		t.Fatal(err)
	}
	p.Mount = func(context.Context, string, string, string, string) error { return nil }
	if _, err := p.Ensure(testContext(t), d); err == nil || !strings.Contains(err.Error(), "does not see it there") {
		t.Errorf("a Mount that mounted nothing: %v", err)
	}
}
