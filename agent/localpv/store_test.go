package localpv

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/gpurack/gpurack/internal/localvol"
)

// recordingQuotas stands in for the kernel's XFS project quotas on the host, whose
// kernel may lack XFS quota support (docs/testing.md): it records what the store asked.
// The QEMU rig checks the real quota (a write past the claim's size gets ENOSPC).
type recordingQuotas struct {
	limits map[uint32]int64
	fail   error
}

func (q *recordingQuotas) Limit(mp, dir string, id uint32, bytes int64) error {
	if q.fail != nil {
		return q.fail
	}
	if _, err := os.Stat(dir); err != nil {
		return err
	}
	q.limits[id] = bytes
	return nil
}

func (q *recordingQuotas) Clear(mp string, id uint32) error {
	delete(q.limits, id)
	return nil
}

func newStore(t *testing.T, disks ...string) (*Store, *recordingQuotas) {
	t.Helper()
	q := &recordingQuotas{limits: map[uint32]int64{}}
	return &Store{Disks: func() []string { return disks }, Quotas: q}, q
}

// TestKernelStructSizes: the structs passed to the kernel have its sizes (linux/fs.h,
// linux/dqblk_xfs.h); the ioctl numbers encode 28.
func TestKernelStructSizes(t *testing.T) {
	if n := unsafe.Sizeof(fsxattr{}); n != 28 {
		t.Errorf("fsxattr is %d bytes, want 28", n)
	}
	if n := unsafe.Sizeof(fsDiskQuota{}); n != 112 {
		t.Errorf("fs_disk_quota is %d bytes, want 112", n)
	}
	if qcmd(qXSetQLim, prjQuota) != 0x580402 {
		t.Errorf("QCMD(Q_XSETQLIM, PRJQUOTA) = %#x", qcmd(qXSetQLim, prjQuota))
	}
}

// TestStoreCreateDelete: a volume goes to the disk with the most free space, gets a
// project and a limit of its size, is found again under its name (a repeated Create
// returns it), reserves its size, and Delete removes its directory, limit and record
// and nothing beside it.
func TestStoreCreateDelete(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	s, q := newStore(t, a, b)
	spaces, err := s.Space()
	if err != nil || len(spaces) != 2 || spaces[0].Free <= 0 {
		t.Fatalf("Space = %+v, %v", spaces, err)
	}
	v, err := s.Create("pvc-1", 1<<20, 0o770, "ns/data")
	if err != nil {
		t.Fatal(err)
	}
	if v.Project != firstProject || q.limits[firstProject] != 1<<20 || !strings.HasPrefix(v.Path, v.Disk+"/"+localvol.VolumesDir+"/") {
		t.Errorf("volume %+v, limits %v", v, q.limits)
	}
	if st, err := os.Stat(v.Path); err != nil || st.Mode().Perm() != 0o770 {
		t.Errorf("directory %s: %v %v, want mode 0770", v.Path, st.Mode(), err)
	}
	again, err := s.Create("pvc-1", 1<<20, 0o770, "ns/data")
	if err != nil || again.Path != v.Path || again.Project != v.Project {
		t.Errorf("second Create = %+v, %v; want the same volume", again, err)
	}
	w, err := s.Create("pvc-2", 1<<20, 0o777, "ns/other")
	if err != nil || w.Project != firstProject+1 {
		t.Fatalf("pvc-2 = %+v, %v", w, err)
	}
	after, _ := s.Space()
	var reserved int64
	for _, d := range after {
		reserved += d.Reserved
	}
	if reserved != 2<<20 {
		t.Errorf("reserved %d, want %d", reserved, 2<<20)
	}
	sibling := filepath.Join(v.Disk, localvol.VolumesDir, "keep")
	if err := os.WriteFile(sibling, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.Path, "data"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("pvc-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("volume directory still there: %v", err)
	}
	if _, ok := q.limits[v.Project]; ok {
		t.Error("quota limit not cleared")
	}
	if _, err := os.Stat(sibling); err != nil {
		t.Errorf("Delete removed a file beside the volume: %v", err)
	}
	if _, ok, _ := s.Lookup("pvc-1"); ok {
		t.Error("record still there")
	}
	if err := s.Delete("pvc-1"); err != nil {
		t.Errorf("deleting a deleted volume: %v", err)
	}
}

// TestStoreRefuses: no disk, too big, a bad name and a failed quota make no volume and
// leave no directory; a record that does not decode stops the store with its path.
func TestStoreRefuses(t *testing.T) {
	none, _ := newStore(t)
	if _, err := none.Create("pvc-1", 1, 0o777, ""); !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "none is ready") {
		t.Errorf("no disks: %v", err)
	}
	dir := t.TempDir()
	s, q := newStore(t, dir)
	if _, err := s.Create("pvc-big", 1<<62, 0o777, ""); !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "free of") {
		t.Errorf("too big: %v", err)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := s.Create(bad, 1, 0o777, ""); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	q.fail = errors.New("no quota")
	if _, err := s.Create("pvc-q", 1<<20, 0o777, ""); err == nil || !strings.Contains(err.Error(), "no quota") {
		t.Errorf("failed quota: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, localvol.VolumesDir, "pvc-q")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Create left its directory: %v", err)
	}
	q.fail = nil
	rec, _ := json.Marshal(Record{Name: "other", Bytes: 1, Project: firstProject})
	if err := os.WriteFile(filepath.Join(dir, recordsDir, "pvc-x.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("pvc-2", 1, 0o777, ""); err == nil || !strings.Contains(err.Error(), "pvc-x.json") {
		t.Errorf("a bad record: %v", err)
	}
}
