package debcache

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/profile"
)

func put(t *testing.T, c *Cache, content string) profile.LockedPackage {
	lp := locked(content)
	os.MkdirAll(filepath.Dir(c.Path(lp.SHA256)), 0o755)
	if err := os.WriteFile(c.Path(lp.SHA256), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return lp
}

func TestExportImportRoundTrip(t *testing.T) {
	src := &Cache{Dir: t.TempDir()}
	a, b := put(t, src, "first deb"), put(t, src, "second deb")
	var buf1, buf2 bytes.Buffer
	if n, err := src.Export(&buf1, []profile.LockedPackage{b, a}); err != nil || n != 2 {
		t.Fatalf("export: %d %v", n, err)
	}
	src.Export(&buf2, nil)
	if !bytes.Equal(buf1.Bytes(), buf2.Bytes()) {
		t.Error("exporting the same entries twice gave different bytes")
	}
	dst := &Cache{Dir: t.TempDir()}
	added, present, err := dst.Import(bytes.NewReader(buf1.Bytes()))
	if err != nil || added != 2 || present != 0 {
		t.Fatalf("import: %d %d %v", added, present, err)
	}
	if added, present, _ = dst.Import(bytes.NewReader(buf1.Bytes())); added != 0 || present != 2 {
		t.Fatalf("re-import: %d added %d present", added, present)
	}
	missing := locked("never cached")
	if _, err := src.Export(&bytes.Buffer{}, []profile.LockedPackage{a, missing}); err == nil || !strings.Contains(err.Error(), "hello 1.0-1") {
		t.Fatalf("export of a missing entry: %v", err)
	}
}

func TestImportRejectsCorruptedEntry(t *testing.T) {
	lp := locked("real")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	name := "sha256/" + lp.SHA256[:2] + "/" + lp.SHA256 + ".deb"
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 4, Typeflag: tar.TypeReg})
	tw.Write([]byte("fake"))
	tw.Close()
	c := &Cache{Dir: t.TempDir()}
	if _, _, err := c.Import(&buf); err == nil || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("err = %v", err)
	}
	if c.Has(lp.SHA256) {
		t.Fatal("a corrupted entry was kept")
	}
}
