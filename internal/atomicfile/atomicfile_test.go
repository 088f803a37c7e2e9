package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReplacesAndCreateRefuses(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := Create(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("two"), 0o600); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("Create over an existing file: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Fatalf("a refused Create changed the file to %q", b)
	}
	if err := Write(p, []byte("three"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	st, _ := os.Stat(p)
	if string(b) != "three" || st.Mode().Perm() != 0o644 {
		t.Fatalf("after Write: %q %v", b, st.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, 0o644); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("want an error naming the path, got %v", err)
	}
}

// The mode is exact, whatever the umask: a key written 0600 must not end up 0644, and a
// unit written 0644 must not end up 0600.
func TestWriteModeIgnoresUmask(t *testing.T) {
	dir := t.TempDir()
	for _, perm := range []os.FileMode{0o600, 0o640, 0o644, 0o755} {
		p := filepath.Join(dir, perm.String())
		if err := Write(p, []byte("x"), perm); err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(p); st.Mode().Perm() != perm {
			t.Errorf("Write with %v made %v", perm, st.Mode().Perm())
		}
	}
}

func TestWriteMkdirAll(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "kubelet.conf")
	if err := WriteMkdirAll(p, []byte("k"), 0o600, 0o700); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "k" {
		t.Fatalf("read back %q, %v", b, err)
	}
	st, _ := os.Stat(filepath.Join(dir, "a", "b"))
	if !st.IsDir() || st.Mode().Perm()&0o077 != 0 {
		t.Errorf("parent made with %v, want at most 0700", st.Mode())
	}
	// A parent that is a file cannot be made: the error names the target.
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o644)
	if err := WriteMkdirAll(filepath.Join(blocker, "x"), nil, 0o644, 0o755); err == nil || !strings.Contains(err.Error(), filepath.Join(blocker, "x")) {
		t.Fatalf("want an error naming the path, got %v", err)
	}
}

// A failed replace leaves the old file and no temporary file.
func TestFailedWriteLeavesOldContent(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "t")
	// Renaming a file over a non-empty directory fails after the data is written.
	if err := os.MkdirAll(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("new"), 0o644); err == nil {
		t.Fatal("Write over a non-empty directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "t" || !entries[0].IsDir() {
		t.Fatalf("after a failed Write the directory holds %v", entries)
	}
}

func TestWriteJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "r.json")
	if err := WriteJSON(path, map[string]int{"b": 2, "a": 1}, 0o600, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if want := "{\n  \"a\": 1,\n  \"b\": 2\n}\n"; err != nil || string(data) != want {
		t.Errorf("%q, %v; want %q", data, err, want)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("mode: %v %v", st, err)
	}
	if err := WriteJSON(path, func() {}, 0o600, 0o700); err == nil {
		t.Error("a value JSON cannot encode was written")
	}
	if data2, _ := os.ReadFile(path); string(data2) != string(data) {
		t.Error("a failed WriteJSON changed the file")
	}
}
