//go:build linux

package memtrim

import (
	"os"
	"path/filepath"
	"testing"
)

// Trim on the test binary itself: it advises the binary's read-only mappings, and the
// resident file pages go down (the test binary, like gpuagent, mapped much of itself
// while starting).
func TestTrimGivesBackExecutablePages(t *testing.T) {
	r, err := Trim()
	if err != nil {
		t.Fatal(err)
	}
	if r.Mappings == 0 || r.Bytes == 0 {
		t.Fatalf("advised %d mappings, %d bytes", r.Mappings, r.Bytes)
	}
	if r.AfterKiB >= r.RssFileKiB {
		t.Errorf("RssFile %d KiB before, %d KiB after: nothing given back", r.RssFileKiB, r.AfterKiB)
	}
	t.Logf("advised %d mappings (%d MiB): RssFile %d KiB -> %d KiB", r.Mappings, r.Bytes>>20, r.RssFileKiB, r.AfterKiB)
}

// Only the executable's private, non-writable mappings are picked; a maps file that
// names none, or a bad range, is an error.
func TestExeRanges(t *testing.T) {
	maps := filepath.Join(t.TempDir(), "maps")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(maps, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`00400000-01000000 r-xp 00000000 fd:01 42   /usr/bin/gpuagent
01000000-02000000 r--p 00c00000 fd:01 42   /usr/bin/gpuagent
02000000-02100000 rw-p 01c00000 fd:01 42   /usr/bin/gpuagent
02100000-02200000 rw-p 00000000 00:00 0
7f0000000000-7f0000001000 r--s 00000000 fd:01 43   /usr/bin/gpuagent
7f0000002000-7f0000003000 r-xp 00000000 fd:01 44   /usr/lib/libc.so.6
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0    [stack]
`)
	got, err := exeRanges(maps, "/usr/bin/gpuagent")
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]uintptr{{0x400000, 0x1000000}, {0x1000000, 0x2000000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ranges %#x, want %#x", got, want)
	}
	if _, err := exeRanges(maps, "/usr/bin/other"); err == nil {
		t.Error("no mapping of the executable: no error")
	}
	write("zz-01000000 r-xp 00000000 fd:01 42 /usr/bin/gpuagent\n")
	if _, err := exeRanges(maps, "/usr/bin/gpuagent"); err == nil {
		t.Error("bad range: no error")
	}
	if _, err := exeRanges(filepath.Join(t.TempDir(), "none"), "/x"); err == nil {
		t.Error("missing maps file: no error")
	}
}
