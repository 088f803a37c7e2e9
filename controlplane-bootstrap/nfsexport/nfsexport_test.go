package nfsexport

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFile: one line per share with every client's options, fsid when asked; bad
// shares, clients and fsids are refused with what to write.
func TestFile(t *testing.T) {
	got, err := File(Options{Share: "/srv/gpurack", FSID: 7,
		Clients: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("10.10.0.0/16")}})
	if err != nil {
		t.Fatal(err)
	}
	want := "/srv/gpurack 10.0.2.0/24(rw,sync,no_subtree_check,no_root_squash,sec=sys,fsid=7) 10.10.0.0/16(rw,sync,no_subtree_check,no_root_squash,sec=sys,fsid=7)\n"
	if lines := strings.SplitAfter(string(got), "\n"); len(lines) < 3 || lines[2] != want || !strings.HasPrefix(lines[0], "# ") {
		t.Errorf("file:\n%s\nwant a comment header, then\n%s", got, want)
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Share: "/", Clients: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "not / itself"},
		{Options{Share: "srv", Clients: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "clean absolute path"},
		{Options{Share: "/srv/a b", Clients: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "clean absolute path"},
		{Options{Share: "/srv/gpurack"}, "no clients"},
		{Options{Share: "/srv/gpurack", Clients: []netip.Prefix{netip.MustParsePrefix("10.0.2.15/24")}}, "host bits zero"},
		{Options{Share: "/srv/gpurack", Clients: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}, FSID: -1}, "positive number"},
	} {
		if _, err := File(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.o, err, tc.want)
		}
	}
}

// TestSetup makes the directories and the file and runs the reload program; a failed
// reload says what to install; a dry run changes nothing.
func TestSetup(t *testing.T) {
	dir := t.TempDir()
	share, exports := filepath.Join(dir, "srv/gpurack"), filepath.Join(dir, "etc/exports.d/gpurack.exports")
	clients := []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24")}
	var out bytes.Buffer
	if err := Setup(context.Background(), Options{Share: share, Clients: clients, ExportsFile: exports, DryRun: true, Out: &out}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(share); !os.IsNotExist(err) || !strings.Contains(out.String(), "would make") {
		t.Errorf("dry run: share %v, printed %q", err, out.String())
	}
	// true(1) stands for exportfs, whose real run is TestRack's, on a node.
	if err := Setup(context.Background(), Options{Share: share, Clients: clients, ExportsFile: exports, Exportfs: "true", Out: &out}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"volumes", "archived"} {
		if fi, err := os.Stat(filepath.Join(share, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
	if b, err := os.ReadFile(exports); err != nil || !strings.Contains(string(b), share+" 10.0.2.0/24(rw,") {
		t.Errorf("exports file: %q %v", b, err)
	}
	err := Setup(context.Background(), Options{Share: share, Clients: clients, ExportsFile: exports, Exportfs: "false", Out: &out})
	if err == nil || !strings.Contains(err.Error(), "apt-get install nfs-kernel-server") {
		t.Errorf("a failed reload: %v; want it to name the package", err)
	}
}
