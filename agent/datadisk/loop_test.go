package datadisk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

// The tests in this file and those that call loopDisk run the real parts: loop devices
// (with partition scanning, and 4096-byte sectors for a 4Kn drive), blkid, mkfs.xfs, the
// kernel's XFS with project quotas, LVM and mdadm. They need root.

const aptHint = "apt-get install util-linux xfsprogs lvm2 mdadm e2fsprogs; hack/deps.sh installs them"

// needDevices stops t unless it can make loop devices and run what the package runs.
func needDevices(t *testing.T) {
	t.Helper()
	testreq.Root(t, "attaching loop devices")
	testreq.File(t, "/dev/loop-control", "load the loop module (modprobe loop)")
	for _, tool := range []string{"losetup", "blkid", "mkfs.xfs", "xfs_quota"} {
		testreq.Tool(t, tool, aptHint)
	}
}

// loopDisk makes a sparse image of size bytes, lets fill write to it, attaches it as a
// loop device with partition scanning and sectorSize-byte logical blocks, and returns
// the Disk Discover reads for it. The loop device is detached in t.Cleanup, also when
// the test fails.
func loopDisk(t *testing.T, size int64, sectorSize int, fill func(image string)) Disk {
	t.Helper()
	needDevices(t)
	image := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fill != nil {
		fill(image)
	}
	out := run(t, "losetup", "--find", "--show", "--partscan", "--sector-size", strconv.Itoa(sectorSize), image)
	dev := strings.TrimSpace(out)
	t.Cleanup(func() {
		// The partition may still be mounted when a test failed half-way.
		for _, p := range mountsOf(dev) {
			_ = Unmount(p)
		}
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("detach %s: %v: %s", dev, err, out)
		}
	})
	disks, err := Discover(DiscoverOptions{IncludeLoop: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range disks {
		if d.Path == dev {
			return d
		}
	}
	t.Fatalf("Discover did not list %s", dev)
	return Disk{}
}

// mountsOf returns the mount points of dev's partitions, from /proc/self/mountinfo.
func mountsOf(dev string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		for i, x := range f {
			if x == "-" && i+2 < len(f) && strings.HasPrefix(f[i+2], dev+"p") {
				out = append(out, f[4])
			}
		}
	}
	return out
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// sha256Of hashes all of path (an image or a device).
func sha256Of(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestDiscoverLoopDevice(t *testing.T) {
	for _, sector := range []int{512, 4096} {
		t.Run(strconv.Itoa(sector), func(t *testing.T) {
			d := loopDisk(t, 64<<20, sector, nil)
			if d.Size != 64<<20 || d.LogicalBlockSize != sector || d.PhysicalBlockSize < sector || d.Transport != TransportLoop || d.ReadOnly || d.Removable {
				t.Errorf("discovered %+v", d)
			}
			if !strings.HasPrefix(d.Serial, "loop:") || !strings.HasSuffix(d.Serial, "disk.img") {
				t.Errorf("serial %q", d.Serial)
			}
			// Without IncludeLoop a loop device is not a disk.
			disks, err := Discover(DiscoverOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range disks {
				if x.Path == d.Path {
					t.Errorf("%s listed without IncludeLoop", d.Path)
				}
			}
		})
	}
}
