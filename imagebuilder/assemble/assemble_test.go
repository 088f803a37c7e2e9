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

// TestModuleClosureSoftdeps is the Debian 6.1 case that left nodes without nftables:
// nf_tables needs libcrc32c, whose softdep "pre: crc32c" is an alias of crc32c_generic
// and crc32c_intel; without them libcrc32c, and so nf_tables, fails to load.
func TestModuleClosureSoftdeps(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"modules.dep": `kernel/net/netfilter/nf_tables.ko: kernel/net/netfilter/nfnetlink.ko kernel/lib/libcrc32c.ko
kernel/net/netfilter/nfnetlink.ko:
kernel/lib/libcrc32c.ko:
kernel/crypto/crc32c_generic.ko:
kernel/arch/x86/crypto/crc32c-intel.ko:
kernel/drivers/a.ko:
kernel/drivers/b.ko:
`,
		"modules.softdep": `# Soft dependencies extracted from modules themselves.
softdep libcrc32c pre: crc32c
softdep a post: b missing-module
softdep b pre: a
`,
		"modules.alias": `# Aliases extracted from modules themselves.
alias crc32c crc32c_intel
alias crc32c crc32c_generic
alias crypto-crc32c crc32c_generic
alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia
`,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	md, err := ParseModulesDep(filepath.Join(dir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	without, err := md.Closure([]string{"nf_tables"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := md.ReadSoftdeps(filepath.Join(dir, "modules.softdep"), filepath.Join(dir, "modules.alias")); err != nil {
		t.Fatal(err)
	}
	got, err := md.Closure([]string{"nf_tables"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"kernel/crypto/crc32c_generic.ko", "kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/lib/libcrc32c.ko",
		"kernel/net/netfilter/nfnetlink.ko", "kernel/net/netfilter/nf_tables.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("with softdeps: got %q\nwant %q (without them: %q)", got, want, without)
	}
	if len(without) != 3 {
		t.Fatalf("without softdeps: got %q, want nf_tables, nfnetlink and libcrc32c only", without)
	}
	// Softdeps that point at each other are no cycle; one naming nothing is skipped.
	got, err = md.Closure([]string{"a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"kernel/drivers/b.ko", "kernel/drivers/a.ko"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a's softdeps: got %q, want %q", got, want)
	}
	if err := md.ReadSoftdeps(filepath.Join(dir, "none"), filepath.Join(dir, "none")); err != nil {
		t.Fatalf("missing softdep files: %v", err)
	}
}
