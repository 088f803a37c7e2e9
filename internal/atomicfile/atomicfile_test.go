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
