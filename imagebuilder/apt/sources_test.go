package apt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/profile"
)

func TestHostDebianSources(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "sources.list.d", "debian.sources"), []byte(`Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: https://vendor.example/node
Suites: nodistro
Components: main
Signed-By: /usr/share/keyrings/vendor.gpg
`), 0o644)
	os.WriteFile(filepath.Join(dir, "sources.list.d", "other.list"), []byte("deb https://vendor.example/apt cloud-sdk main\n"), 0o644)
	got, err := HostDebianSources(dir, "trixie", []string{"main", "contrib"})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, s := range got {
		lines = append(lines, s.Line())
	}
	want := []string{
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian trixie main contrib",
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian-security trixie-security main contrib",
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian trixie-updates main contrib",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if _, err := HostDebianSources(t.TempDir(), "bookworm", nil); err == nil || !strings.Contains(err.Error(), "base.mirror") {
		t.Fatalf("no sources: err = %v", err)
	}
}

func TestInstRE(t *testing.T) {
	m := instRE.FindStringSubmatch("Inst libc6 (2.36-9+deb12u10 Debian:12.11/stable, Debian-Security:12/stable-security [amd64])")
	if m == nil || m[1] != "libc6" || m[2] != "2.36-9+deb12u10" || m[3] != "amd64" {
		t.Fatalf("%q", m)
	}
	m = instRE.FindStringSubmatch("Inst base-files [12.4] (12.4+deb12u11 Debian:12.11/stable [amd64])")
	if m == nil || m[2] != "12.4+deb12u11" {
		t.Fatalf("%q", m)
	}
}

func TestStale(t *testing.T) {
	a := profile.LockedPackage{Name: "a", Version: "1", SHA256: "aa"}
	b := profile.LockedPackage{Name: "b", Version: "2", SHA256: "bb"}
	c := profile.LockedPackage{Name: "c", Version: "3", SHA256: "cc"}
	d := profile.LockedPackage{Name: "d", Version: "4", SHA256: "dd"}
	l := &profile.Lock{ProfileDigest: "sha256:1", Packages: []profile.LockedPackage{a, b, c}, Build: []profile.LockedPackage{d}}
	avail := map[string]profile.LockedPackage{"a=1": a, "c=3": {Name: "c", Version: "3", SHA256: "ee"}}
	cached := func(s string) bool { return s == "dd" }
	got := strings.Join(Stale(l, "sha256:2", avail, cached), "\n")
	for _, want := range []string{"profileDigest: the profile changed", "b 2: no longer in the archive and not in the .deb cache", "c 3: the archive's .deb has sha256 ee"} {
		if !strings.Contains(got, want) {
			t.Errorf("stale report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "a 1") || strings.Contains(got, "d 4") {
		t.Errorf("fresh packages reported:\n%s", got)
	}
	if s := Stale(l, "sha256:1", map[string]profile.LockedPackage{"a=1": a, "b=2": b, "c=3": c}, cached); len(s) != 0 {
		t.Errorf("fresh lock reported stale: %q", s)
	}
}
