package build

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/profile"
)

func TestLockEpochIsNewestReleaseDate(t *testing.T) {
	l := &profile.Lock{Release: []profile.Release{
		{Suite: "bookworm", Date: "Sat, 11 Jul 2026 10:16:37 UTC"},
		{Suite: "bookworm-security", Date: "Sat, 28 Nov 2026 02:53:00 UTC"},
	}}
	got, err := lockEpoch(l)
	if err != nil || got != 1795834380 {
		t.Fatalf("lockEpoch = %d, %v; want 1795834380", got, err)
	}
	l.Release[0].Date = "yesterday"
	if _, err := lockEpoch(l); err == nil || !strings.Contains(err.Error(), "SOURCE_DATE_EPOCH") {
		t.Fatalf("err = %v", err)
	}
}

func TestCheckInstalled(t *testing.T) {
	list := filepath.Join(t.TempDir(), "installed.txt")
	os.WriteFile(list, []byte("bash 5.2.15-2+b9 amd64\nsystemd 252.39-1~deb12u2 amd64\nsurprise 1 all\n"), 0o644)
	want := map[string]profile.LockedPackage{
		"a": {Name: "bash", Version: "5.2.15-2+b9"},
		"b": {Name: "systemd", Version: "252.38-1~deb12u1"},
		"c": {Name: "udev", Version: "252.39-1~deb12u2"},
	}
	err := checkInstalled(list, want)
	for _, w := range []string{"systemd installed at 252.39-1~deb12u2, locked at 252.38-1~deb12u1", "udev 252.39-1~deb12u2 locked but not installed", "surprise 1 installed but not locked"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
	delete(want, "b")
	delete(want, "c")
	os.WriteFile(list, []byte("bash 5.2.15-2+b9 amd64\n"), 0o644)
	if err := checkInstalled(list, want); err != nil {
		t.Fatal(err)
	}
}

func TestCheckDriverInputs(t *testing.T) {
	p := &profile.Profile{Name: "nv", GPU: &profile.GPU{Driver: profile.Driver{Version: "535.261.03", Flavor: "open"}}}
	pkg := func(n, v string) profile.LockedPackage { return profile.LockedPackage{Name: n, Version: v} }
	good := &profile.Lock{
		Packages: []profile.LockedPackage{pkg("libnvidia-ml1", "535.261.03-1"), pkg("nvidia-smi", "535.261.03-1"), pkg("firmware-nvidia-gsp", "535.261.03-1"), pkg("nvidia-kernel-support", "535.261.03-1")},
		Build:    []profile.LockedPackage{pkg("nvidia-open-kernel-dkms", "535.261.03-1")},
	}
	if err := checkDriverInputs(p, good); err != nil {
		t.Fatal(err)
	}
	noFW := *good
	noFW.Packages = good.Packages[:2:2]
	noFW.Packages = append(noFW.Packages, good.Packages[3])
	if err := checkDriverInputs(p, &noFW); err == nil || !strings.Contains(err.Error(), "missing GSP firmware: firmware-nvidia-gsp 535.261.03-*") {
		t.Errorf("err = %v", err)
	}
	skew := *good
	skew.Packages = append([]profile.LockedPackage{}, good.Packages...)
	skew.Packages[1] = pkg("nvidia-smi", "535.309.01-1")
	if err := checkDriverInputs(p, &skew); err == nil || !strings.Contains(err.Error(), "nvidia-smi is locked at 535.309.01-1 but the driver is 535.261.03") {
		t.Errorf("err = %v", err)
	}
	noSrc := *good
	noSrc.Build = nil
	if err := checkDriverInputs(p, &noSrc); err == nil || !strings.Contains(err.Error(), "missing module sources: nvidia-open-kernel-dkms") {
		t.Errorf("err = %v", err)
	}
}
