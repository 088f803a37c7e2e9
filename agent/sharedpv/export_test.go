package sharedpv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// TestExportLifecycle: a volume directory is made with its mode, archived under a
// stamped name with its data, and a second one removed; a name that is not the
// volume's is refused and nothing on the export moves.
func TestExportLifecycle(t *testing.T) {
	e := Export{Dir: t.TempDir()}
	sibling := filepath.Join(e.Dir, "operator-notes.txt")
	if err := os.WriteFile(sibling, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, b := sharedvol.DirName("alpha", "data", "pvc-1"), sharedvol.DirName("alpha", "scratch", "pvc-2")
	for _, n := range []struct{ name, pv string }{{a, "pvc-1"}, {b, "pvc-2"}} {
		if err := e.Create(n.name, n.pv, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(e.Dir, "volumes", a))
	if err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("volume directory: %v %v; want mode 0750", fi, err)
	}
	if err := e.Create(a, "pvc-1", 0o750); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Errorf("second Create of %s: %v; want 'exists already'", a, err)
	}
	if err := os.WriteFile(filepath.Join(e.Dir, "volumes", a, "model.bin"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	to, err := e.Archive(a, "pvc-1", time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(e.Dir, "archived", a+".20261206T090000Z"); to != want {
		t.Errorf("archived to %s, want %s", to, want)
	}
	if got, err := os.ReadFile(filepath.Join(to, "model.bin")); err != nil || string(got) != "weights" {
		t.Errorf("archived data: %q %v", got, err)
	}
	if to, err := e.Archive(a, "pvc-1", time.Now()); err != nil || to != "" {
		t.Errorf("archiving a directory gone already: %q %v; want nothing, no error", to, err)
	}
	if err := e.Remove(b, "pvc-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.Dir, "volumes", b)); !os.IsNotExist(err) {
		t.Errorf("removed volume still there: %v", err)
	}
	if got, err := os.ReadFile(sibling); err != nil || string(got) != "keep" {
		t.Errorf("a file beside the volumes: %q %v", got, err)
	}
}

// TestExportRefusesOthers: names that would reach above a volume's own directory, or
// another volume's, and a link in a volume's place, are refused; the export is left
// as it was.
func TestExportRefusesOthers(t *testing.T) {
	e := Export{Dir: t.TempDir()}
	if err := e.Create(sharedvol.DirName("beta", "w", "pvc-9"), "pvc-9", 0o777); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	link := sharedvol.DirName("alpha", "x", "pvc-3")
	if err := os.Symlink(outside, filepath.Join(e.Dir, "volumes", link)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, pv, want string }{
		{"", "pvc-1", "not a gpurack-shared volume directory"},
		{".", "pvc-1", "not a gpurack-shared volume directory"},
		{"..", "pvc-1", "not a gpurack-shared volume directory"},
		{"../volumes", "pvc-1", "not a gpurack-shared volume directory"},
		{"alpha_x_pvc-1/..", "pvc-1", "not a gpurack-shared volume directory"},
		{sharedvol.DirName("beta", "w", "pvc-9"), "pvc-1", "is not volume pvc-1's"},
		{link, "pvc-3", "not a directory"},
	} {
		if err := e.Remove(tc.name, tc.pv); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Remove(%q, %s): %v; want %q", tc.name, tc.pv, err, tc.want)
		}
		if _, err := e.Archive(tc.name, tc.pv, time.Now()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Archive(%q, %s): %v; want %q", tc.name, tc.pv, err, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(e.Dir, "volumes", sharedvol.DirName("beta", "w", "pvc-9"))); err != nil {
		t.Errorf("beta's volume: %v", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the link's target: %v", err)
	}
}
