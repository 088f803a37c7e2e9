package assemble

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

func TestCpioIsReproducibleAndReadable(t *testing.T) {
	src := filepath.Join(t.TempDir(), "init")
	os.WriteFile(src, []byte("#!/bin/sh\n"), 0o755)
	entries := []Entry{
		{Path: "lib/modules/k/b.ko", Mode: ModeReg | 0o644, Data: []byte("b")},
		{Path: "/init", Mode: ModeReg | 0o755, Source: src},
		{Path: "dev/console", Mode: ModeChr | 0o600, Major: 5, Minor: 1},
		{Path: "bin/sh", Mode: ModeLink | 0o777, Data: []byte("busybox")},
	}
	var a, b bytes.Buffer
	if err := WriteCpio(&a, entries, 1700000000); err != nil {
		t.Fatal(err)
	}
	// Reversed input order, the same archive.
	rev := []Entry{entries[3], entries[2], entries[1], entries[0]}
	if err := WriteCpio(&b, rev, 1700000000); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same entries in another order gave different bytes")
	}
	testreq.Tool(t, "cpio", "apt-get install cpio (hack/deps.sh lists it); it cross-checks the archive")
	cmd := exec.Command("sh", "-c", "gzip -dc | cpio -tv --quiet")
	cmd.Stdin = &a
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GNU cpio cannot read it: %v\n%s", err, out)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		names = append(names, f[len(f)-1])
		if f[2] != "root" && f[2] != "0" {
			t.Errorf("owner not root: %s", l)
		}
	}
	for _, w := range []string{"bin/sh -> busybox", "dev/console", "init", "lib/modules/k/b.ko"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("archive lacks %s:\n%s", w, out)
		}
	}
	if len(names) != 8 { // bin bin/sh dev dev/console init lib lib/modules lib/modules/k + b.ko = 9, minus the link's target field
		t.Logf("entries: %q", names)
	}
}

func TestModuleClosure(t *testing.T) {
	dir := t.TempDir()
	dep := `kernel/fs/overlayfs/overlay.ko:
kernel/net/bridge/br_netfilter.ko: kernel/net/bridge/bridge.ko kernel/net/802/stp.ko kernel/net/llc/llc.ko
kernel/net/bridge/bridge.ko: kernel/net/802/stp.ko kernel/net/llc/llc.ko
kernel/net/802/stp.ko: kernel/net/llc/llc.ko
kernel/net/llc/llc.ko:
kernel/drivers/char/hw_random/virtio-rng.ko:
`
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	md, err := ParseModulesDep(filepath.Join(dir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := md.Closure([]string{"br_netfilter", "overlay", "virtio-rng", "unix"}, map[string]bool{"unix": true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/net/llc/llc.ko", "kernel/net/802/stp.ko", "kernel/net/bridge/bridge.ko", "kernel/net/bridge/br_netfilter.ko",
		"kernel/fs/overlayfs/overlay.ko", "kernel/drivers/char/hw_random/virtio-rng.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if _, err := md.Closure([]string{"nvidia"}, nil); err == nil || !strings.Contains(err.Error(), "nvidia is neither in modules.dep nor built in") {
		t.Fatalf("err = %v", err)
	}
}
