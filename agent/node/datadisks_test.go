package node

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/agent/datadisk"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestDiskReportCarriesAWipeOnceAndItsResultUntilRecorded: a request repeated in every
// heartbeat answer reaches the service once; its result goes in every heartbeat until
// an answer no longer carries the request.
func TestDiskReportCarriesAWipeOnceAndItsResultUntilRecorded(t *testing.T) {
	r := newDiskReport()
	if r.snapshot() != nil || r.wipeResult() != nil {
		t.Fatal("a new report has a look or a result")
	}
	w := &machinev1.DataDiskWipe{Id: "w1", Path: "/dev/vdc", Serial: "S1"}
	r.answer(w)
	r.answer(w) // the next answer repeats it while the service works
	if got := <-r.wipes; got.GetId() != "w1" {
		t.Fatalf("service got %v", got)
	}
	select {
	case again := <-r.wipes:
		t.Fatalf("the repeated request reached the service again: %v", again)
	default:
	}
	r.setResult(&machinev1.DataDiskWipeResult{Id: "w1", Wiped: true})
	r.answer(w) // gpuboot has not seen the result yet
	if res := r.wipeResult(); res.GetId() != "w1" || !res.GetWiped() {
		t.Fatalf("result dropped before gpuboot recorded it: %v", res)
	}
	select {
	case again := <-r.wipes:
		t.Fatalf("a request already carried out reached the service again: %v", again)
	default:
	}
	r.answer(nil) // gpuboot recorded it and dropped the request
	if res := r.wipeResult(); res != nil {
		t.Fatalf("result still owed after gpuboot dropped the request: %v", res)
	}
	r.answer(&machinev1.DataDiskWipe{Id: "w2", Path: "/dev/vdc", Serial: "S1"})
	if got := <-r.wipes; got.GetId() != "w2" {
		t.Fatalf("a second request: %v", got)
	}
}

// TestDataDiskServiceRefusesAForeignDiskAndWritesNothing runs the service's look and
// wipe over real loop devices: a selected disk holding ext4 is refused, named in the
// report with what it holds, and left byte-for-byte as it was; a disk no rule selects
// is listed and not read; wipes without the disk's serial, of an unselected disk or of
// a missing one are refused with the reason. (A loop device has no serial, so the wipe
// that goes through is in the QEMU rack test, on a virtio disk with one.)
func TestDataDiskServiceRefusesAForeignDiskAndWritesNothing(t *testing.T) {
	testreq.Root(t, "attaching loop devices")
	testreq.File(t, "/dev/loop-control", "load the loop module (modprobe loop)")
	for _, tool := range []string{"losetup", "blkid", "mkfs.ext4", "mkfs.xfs"} {
		testreq.Tool(t, tool, "apt-get install util-linux e2fsprogs xfsprogs; hack/deps.sh installs them")
	}
	foreign, foreignImage := loopImage(t, func(image string) {
		run(t, "mkfs.ext4", "-q", "-F", "-L", "scratch", image)
	})
	other, _ := loopImage(t, nil)
	before := fileSum(t, foreignImage)

	sel, err := datadisk.ParseSelector("storage.dataDisks", []datadisk.RuleSpec{{Path: foreign}})
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	s := &dataDiskService{report: newDiskReport(), sel: sel, prep: datadisk.Preparer{Cluster: "sha256:test-cluster", MountRoot: t.TempDir()},
		discover: datadisk.DiscoverOptions{IncludeLoop: true}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), seen: map[string]string{},
		event: func(_ context.Context, reason, msg string, warning bool) { events = append(events, reason+": "+msg) }}
	ctx := context.Background()
	if _, err := s.look(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]*machinev1.DataDisk{}
	for _, d := range s.report.snapshot().GetDisks() {
		got[d.GetPath()] = d
	}
	if d := got[foreign]; d.GetState() != machinev1.DataDiskState_DATA_DISK_STATE_REFUSED || !strings.Contains(d.GetDetail(), `ext4 filesystem (label "scratch")`) {
		t.Errorf("foreign disk reported as %v", d)
	}
	if d := got[other]; d.GetState() != machinev1.DataDiskState_DATA_DISK_STATE_NOT_SELECTED {
		t.Errorf("unselected disk reported as %v", d)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "DataDiskRefused: data disk "+foreign+" (serial loop:"+foreignImage+") refused: it holds ext4") {
		t.Errorf("events %q, want one DataDiskRefused", events)
	}
	if _, err := s.look(ctx); err != nil || len(events) != 1 {
		t.Errorf("a second look with nothing changed: err %v, events %q (want no new event)", err, events)
	}
	if s.Status().State != Running || !strings.Contains(s.Status().Message, "0 data disks ready, 1 refused") {
		t.Errorf("status %+v", s.Status())
	}
	for _, tc := range []struct {
		w    *machinev1.DataDiskWipe
		want string
	}{
		{&machinev1.DataDiskWipe{Id: "a", Path: foreign, Serial: "anything"}, `the request's serial "anything" is not the disk's`},
		{&machinev1.DataDiskWipe{Id: "b", Path: other, Serial: "x"}, "not a data disk by the profile's storage.dataDisks rules"},
		{&machinev1.DataDiskWipe{Id: "c", Path: "/dev/nope", Serial: "x"}, "no disk /dev/nope"},
	} {
		res := s.wipe(ctx, tc.w)
		if res.GetId() != tc.w.GetId() || res.GetWiped() || !strings.Contains(res.GetError(), tc.want) {
			t.Errorf("wipe %v: %v, want refused with %q", tc.w, res, tc.want)
		}
	}
	run(t, "sync")
	if after := fileSum(t, foreignImage); after != before {
		t.Errorf("the refused disk's image changed: sha256 %x before, %x after", before, after)
	}
	// With the disk's serial (a loop device's is its backing file) the wipe goes
	// through, and the disk then reads as empty: the next look prepares it.
	if res := s.wipe(ctx, &machinev1.DataDiskWipe{Id: "d", Path: foreign, Serial: "loop:" + foreignImage}); !res.GetWiped() || res.GetError() != "" {
		t.Fatalf("wipe with the serial: %v", res)
	}
	if n := len(events); n != 5 || !strings.HasPrefix(events[1], "DataDiskWipeRefused: ") || !strings.HasPrefix(events[4], "DataDiskWiped: data disk "+foreign) {
		t.Errorf("events after the wipe %q", events)
	}
	disks, err := datadisk.Discover(datadisk.DiscoverOptions{IncludeLoop: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range disks {
		if d.Path != foreign {
			continue
		}
		ev, err := datadisk.Inspect(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if v := datadisk.Decide(ev, s.prep.Cluster); v.State != datadisk.Empty {
			t.Errorf("after the wipe the disk reads as %v, want empty", v)
		}
	}
	// A wiped disk is no longer refused, so a second request for it is refused.
	if res := s.wipe(ctx, &machinev1.DataDiskWipe{Id: "e", Path: foreign, Serial: "loop:" + foreignImage}); res.GetWiped() || !strings.Contains(res.GetError(), "is not refused") {
		t.Errorf("second wipe: %v", res)
	}
}

// loopImage attaches a sparse 64 MiB image, filled by fill, as a loop device; it
// returns the device and the image. Detached in t.Cleanup.
func loopImage(t *testing.T, fill func(image string)) (dev, image string) {
	t.Helper()
	image = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 64<<20); err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		fill(image)
	}
	dev = strings.TrimSpace(run(t, "losetup", "--find", "--show", image))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("detach %s: %v: %s", dev, err, out)
		}
	})
	return dev, image
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestDataDiskRulesFromGpubootReplaceTheProfiles: the JoinBundle's rules (gpuboot's
// selector) apply when present, the profile's otherwise; bad rules from either are
// errors naming where they came from.
func TestDataDiskRulesFromGpubootReplaceTheProfiles(t *testing.T) {
	nvme := datadisk.Disk{Path: "/dev/nvme0n1", Size: 3840e9, Transport: datadisk.TransportNVMe}
	sata := datadisk.Disk{Path: "/dev/sda", Size: 480e9, Transport: datadisk.TransportSATA}
	profile := []datadisk.RuleSpec{{Transport: "sata"}}
	for _, tc := range []struct {
		name    string
		bundle  *bootv1.DataDiskRules
		nvme    bool
		sata    bool
		wantErr string
	}{
		{"profile's rules", nil, false, true, ""},
		{"gpuboot's rules replace them", &bootv1.DataDiskRules{Rules: []*bootv1.DataDiskRule{{Transport: "nvme", MinSize: "1.92T"}}}, true, false, ""},
		{"a bad rule from gpuboot", &bootv1.DataDiskRules{Rules: []*bootv1.DataDiskRule{{}}}, false, false, "the JoinBundle's data-disk rules (gpuboot's selector): dataDisks[0].path: the rule sets no field"},
	} {
		sel, err := dataDiskSelector(profile, tc.bundle)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := sel.Selects(nvme.Candidate()); got != tc.nvme {
			t.Errorf("%s: NVMe disk selected %v, want %v", tc.name, got, tc.nvme)
		}
		if got := sel.Selects(sata.Candidate()); got != tc.sata {
			t.Errorf("%s: SATA disk selected %v, want %v", tc.name, got, tc.sata)
		}
	}
	if _, err := dataDiskSelector([]datadisk.RuleSpec{{MinSize: "x"}}, nil); err == nil || !strings.Contains(err.Error(), "the profile's data-disk rules: storage.dataDisks[0].minSize") {
		t.Errorf("a bad profile rule: %v", err)
	}
}
