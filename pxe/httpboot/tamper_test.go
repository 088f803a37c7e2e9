package httpboot

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rewriteInPlace overwrites the start of the store's file name of f's image with
// with, keeping its size, and restores its modification time: what an attacker with
// write access to the image store does to evade a size-and-mtime check.
func rewriteInPlace(t *testing.T, f *fixture, name string, with []byte) {
	t.Helper()
	p := filepath.Join(f.store, f.image, name)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt(with, 0); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(p); after.Size() != fi.Size() || !after.ModTime().Equal(fi.ModTime()) {
		t.Fatal("the rewrite changed size or mtime")
	}
}

// TestInPlaceRewriteNotServed reproduces the attack: after an image verified,
// cmdline is rewritten in place to carry init=/bin/sh, same size, mtime restored.
// Neither /boot.ipxe nor /images/…/cmdline may carry the rewritten bytes, and a kernel
// rewritten the same way is not served either.
func TestInPlaceRewriteNotServed(t *testing.T) {
	f := newFixture(t)
	script := f.srv.URL + "/boot.ipxe?mac=52:54:00:12:34:56"
	if _, body := get(t, script); !strings.Contains(string(body), "console=ttyS0,115200") {
		t.Fatalf("boot.ipxe before the rewrite:\n%s", body)
	}
	orig, err := os.ReadFile(filepath.Join(f.store, f.image, "cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	evil := []byte("init=/bin/sh ")
	rewriteInPlace(t, f, "cmdline", evil)

	if _, body := get(t, script); strings.Contains(string(body), "init=/bin/sh") {
		t.Fatalf("boot.ipxe after an in-place rewrite of cmdline carries it:\n%s", body)
	}
	resp, body := get(t, f.srv.URL+"/images/"+f.image+"/cmdline")
	if bytes.Contains(body, []byte("init=/bin/sh")) || (resp.StatusCode == http.StatusOK && !bytes.Equal(body, orig)) {
		t.Fatalf("/images/…/cmdline after an in-place rewrite: %s %q", resp.Status, body)
	}

	f = newFixture(t) // the image above is refused now; a fresh one for the kernel
	if resp, _ := get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("vmlinuz: %s", resp.Status)
	}
	rewriteInPlace(t, f, "vmlinuz", []byte("MZ evil kernel"))
	resp, body = get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz")
	if bytes.Contains(body, []byte("evil kernel")) || (resp.StatusCode == http.StatusOK && !bytes.Equal(body, f.kernel)) {
		t.Fatalf("vmlinuz after an in-place rewrite: %s, %d bytes, served the rewritten bytes", resp.Status, len(body))
	}
}

// TestServedBytesAreTheVerifiedOnes: even a rewrite that no stamp reveals (here the
// cache is told the rewritten file's stamp, as if ctime had been restored too) is
// not served: bytes come from the copy that was hashed.
func TestServedBytesAreTheVerifiedOnes(t *testing.T) {
	f := newFixture(t)
	if resp, _ := get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("vmlinuz: %s", resp.Status)
	}
	rewriteInPlace(t, f, "vmlinuz", []byte("MZ evil kernel"))
	fi, err := os.Stat(filepath.Join(f.store, f.image, "vmlinuz"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := f.handler.images.get(f.image)
	if err != nil {
		t.Fatal(err)
	}
	img.files["vmlinuz"].stamp = stampOf(fi)
	for _, rng := range []string{"", "bytes=0-99"} {
		resp, body := get(t, f.srv.URL+"/images/"+f.image+"/vmlinuz", "Range", rng)
		want := f.kernel
		if rng != "" {
			want = f.kernel[:100]
		}
		if !bytes.Equal(body, want) {
			t.Fatalf("Range %q: %s, %d bytes, not the verified kernel (evil: %v)", rng, resp.Status, len(body), bytes.Contains(body, []byte("evil")))
		}
	}
}
