package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
)

var testEpoch = time.Unix(1700000000, 0)

// tree makes a small root filesystem: files, a symlink, a hard link, a device
// directory with content that must be left out, and an mtime after the epoch.
func tree(t *testing.T) string {
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "etc", "dev", "work"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(root, p), mode)
	}
	write("usr/bin/hello", "#!/bin/sh\necho hi\n", 0o755)
	write("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644)
	write("dev/null-copy", "not in a layer", 0o644)
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "usr/bin/hello"), filepath.Join(root, "usr/bin/hello2")); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1600000000, 0)
	os.Chtimes(filepath.Join(root, "etc/passwd"), old, old)
	return root
}

func entries(t *testing.T, path string) []*tar.Header {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []*tar.Header
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
}

func TestWriteLayerIsDeterministic(t *testing.T) {
	root := tree(t)
	dir := t.TempDir()
	a, err := WriteLayer(root, filepath.Join(dir, "a.tar.gz"), testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	// Touch everything (now is after the epoch): the layer must not change.
	now := time.Now()
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error { return os.Chtimes(p, now, now) })
	os.Chtimes(filepath.Join(root, "etc/passwd"), time.Unix(1600000000, 0), time.Unix(1600000000, 0))
	b, err := WriteLayer(root, filepath.Join(dir, "b.tar.gz"), testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest || a.DiffID != b.DiffID || a.Size != b.Size {
		t.Fatalf("two layers of one tree differ: %+v %+v", a, b)
	}
	var names []string
	for _, h := range entries(t, a.Path) {
		names = append(names, h.Name)
		if h.Uname != "" || h.Gname != "" || !h.AccessTime.IsZero() || !h.ChangeTime.IsZero() {
			t.Errorf("%s carries host names or times: %q %q %v %v", h.Name, h.Uname, h.Gname, h.AccessTime, h.ChangeTime)
		}
		switch {
		case h.Name == "etc/passwd" && !h.ModTime.Equal(time.Unix(1600000000, 0)):
			t.Errorf("etc/passwd mtime %v, want its own (before the epoch)", h.ModTime)
		case h.Name != "etc/passwd" && !h.ModTime.Equal(testEpoch):
			t.Errorf("%s mtime %v, want clamped to the epoch", h.Name, h.ModTime)
		case h.Name == "usr/bin/hello2" && (h.Typeflag != tar.TypeLink || h.Linkname != "usr/bin/hello"):
			t.Errorf("hello2 is not a hard link to hello: %c %s", h.Typeflag, h.Linkname)
		case h.Name == "bin" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "usr/bin"):
			t.Errorf("bin is not the symlink: %c %s", h.Typeflag, h.Linkname)
		}
	}
	want := "bin dev/ etc/ etc/passwd usr/ usr/bin/ usr/bin/hello usr/bin/hello2 work/"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("entries\n got %s\nwant %s", got, want)
	}
}

func testImageArchive(t *testing.T, out string) string {
	root := tree(t)
	l, err := WriteLayer(root, filepath.Join(t.TempDir(), "l.tar.gz"), testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	img, err := Image(l, Config{User: "1000:1000", Workdir: "/work", Env: map[string]string{"A": "b"}, Entrypoint: []string{"/usr/bin/hello"},
		Ports: []string{"8080/tcp"}, Labels: map[string]string{"x": "y"}, History: "test"}, testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(img, "gpurack.example/ci/x:1", "1", out, t.TempDir(), testEpoch); err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	if cf.Config.User != "1000:1000" || cf.Config.Env[0] != "A=b" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(testEpoch) {
		t.Fatalf("config %+v", cf)
	}
	d, _ := img.Digest()
	return d.String()
}

func TestArchiveIsDeterministicAndInspects(t *testing.T) {
	dir := t.TempDir()
	da := testImageArchive(t, filepath.Join(dir, "a.tar"))
	db := testImageArchive(t, filepath.Join(dir, "b.tar"))
	if da != db {
		t.Fatalf("manifest digests differ: %s %s", da, db)
	}
	a, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
	b, _ := os.ReadFile(filepath.Join(dir, "b.tar"))
	if !bytes.Equal(a, b) {
		t.Fatal("two archives of the same image differ")
	}
	f, err := ociarchive.InspectFile(filepath.Join(dir, "a.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Format != ociarchive.FormatOCI || f.Images != 1 || strings.Join(f.Names, ",") != "gpurack.example/ci/x:1" {
		t.Fatalf("inspect: %+v", f.Archive)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

func TestAuthFileLookup(t *testing.T) {
	f, err := ParseAuthFile([]byte(`{"auths": {"reg.example": {"auth": "` + base64.StdEncoding.EncodeToString([]byte("u:p")) + `"},
		"https://reg.example/team": {"username": "t", "password": "q"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for repo, user := range map[string]string{"reg.example/other/x": "u", "reg.example/team/x": "t", "reg.example/teamx/y": "u"} {
		a, ok := f.Lookup(repo)
		if !ok || a.Username != user {
			t.Errorf("%s: got %q %v, want %q", repo, a.Username, ok, user)
		}
	}
	if _, ok := f.Lookup("other.example/x"); ok {
		t.Error("found credentials for another registry")
	}
	for _, bad := range []string{`{"auths": {"r": {}}}`, `{"auths": {"r": {"auth": "!!"}}}`, `[`} {
		if _, err := ParseAuthFile([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// FuzzParseAuthFile: the auth file parser never panics, and what it accepts has
// credentials in every entry.
func FuzzParseAuthFile(f *testing.F) {
	f.Add([]byte(`{"auths": {"reg.example": {"auth": "dTpw"}}}`))
	f.Add([]byte(`{"auths": {"reg.example/team": {"username": "a", "password": "b"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		af, err := ParseAuthFile(data)
		if err != nil {
			return
		}
		for k := range af.Auths {
			if a, ok := af.Lookup(strings.TrimPrefix(k, "https://") + "/x"); ok && a.Username == "" && a.IdentityToken == "" && a.RegistryToken == "" {
				t.Fatalf("entry %q without credentials", k)
			}
		}
	})
}

// TestPush pushes to an in-process registry behind TLS and basic auth, trusting its
// certificate through a CA file and reading credentials from an auth file.
func TestPush(t *testing.T) {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "secret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	host := strings.TrimPrefix(srv.URL, "https://")
	authFile := filepath.Join(dir, "auth.json")
	os.WriteFile(authFile, []byte(`{"auths": {"`+host+`": {"auth": "`+base64.StdEncoding.EncodeToString([]byte("ci:secret"))+`"}}}`), 0o600)

	root := tree(t)
	l, err := WriteLayer(root, filepath.Join(dir, "l.tar.gz"), testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	img, err := Image(l, Config{User: "1000:1000", Workdir: "/work", Entrypoint: []string{"/usr/bin/hello"}}, testEpoch)
	if err != nil {
		t.Fatal(err)
	}
	ref := host + "/ci/x:1"
	if _, err := Push(context.Background(), img, PushOptions{Ref: ref, CA: ca}); err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
		t.Fatalf("anonymous push: %v, want unauthorized", err)
	}
	if _, err := Push(context.Background(), img, PushOptions{Ref: ref, AuthFile: authFile}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("push without the CA: %v, want a certificate error", err)
	}
	got, err := Push(context.Background(), img, PushOptions{Ref: ref, CA: ca, AuthFile: authFile})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got != want.String() {
		t.Fatalf("pushed %s, image is %s", got, want)
	}
	tr, _ := transport(ca)
	r, _ := name.ParseReference(ref)
	desc, err := remote.Get(r, remote.WithTransport(tr), remote.WithAuth(&authn.Basic{Username: "ci", Password: "secret"}))
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != want {
		t.Fatalf("registry holds %s, pushed %s", desc.Digest, want)
	}
}
