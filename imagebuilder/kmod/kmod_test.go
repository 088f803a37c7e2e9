package kmod

import (
	"bytes"
	"strings"
	"testing"
)

func TestCheckVermagic(t *testing.T) {
	k := "6.1.0-50-amd64 SMP preempt mod_unload modversions "
	if err := CheckVermagic(k, map[string]string{"nvidia-current.ko": k}); err != nil {
		t.Fatal(err)
	}
	err := CheckVermagic(k, map[string]string{"nvidia-current.ko": "6.1.0-57-amd64 SMP preempt mod_unload modversions "})
	if err == nil || !strings.Contains(err.Error(), "6.1.0-50-amd64") || !strings.Contains(err.Error(), "6.1.0-57-amd64") {
		t.Fatalf("err = %v", err)
	}
}

func TestIncompatibilityNamesBothVersions(t *testing.T) {
	log := `  CC [M]  nvidia/nv-pci.o
nvidia/nv-pci.c:223:9: error: too few arguments to function 'pci_resize_resource'
  223 |     r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);
`
	err := Incompatibility(Key{Kernel: "6.1.0-57-amd64", Driver: "535.261.03", Flavor: "open"}, "6.1.192-3", log)
	for _, want := range []string{"535.261.03 (open)", "6.1.0-57-amd64 (6.1.192-3)", "nv-pci.c:223", "too few arguments to function 'pci_resize_resource'", "pin a kernel ABI"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestCommonTree(t *testing.T) {
	mk := []byte("# automatically generated\nMAKEARGS := -C /usr/src/linux-headers-6.1.0-50-common O=/usr/src/linux-headers-6.1.0-50-amd64\ninclude /usr/src/linux-headers-6.1.0-50-common/Makefile\n")
	if got := CommonTree(mk, "/usr/src/linux-headers-6.1.0-50-amd64"); got != "/usr/src/linux-headers-6.1.0-50-common" {
		t.Errorf("CommonTree = %q", got)
	}
	if got := CommonTree([]byte("VERSION = 6\n"), "/usr/src/linux-headers-x"); got != "/usr/src/linux-headers-x" {
		t.Errorf("CommonTree without include = %q", got)
	}
}

func TestObjectCounter(t *testing.T) {
	var log bytes.Buffer
	var seen []int
	c := objectCounter(&log, func(n int) { seen = append(seen, n) })
	c.Write([]byte("make -C /usr/src/linux-headers-x\n  CC [M]  nvidia/nv.o\n  CC [M]  nvi"))
	c.Write([]byte("dia/nv-pci.o\n  LD [M]  nvidia.o\n   CC  src/nvidia/arch/nvalloc/unix/src/os.c\n  CCX not a compile\n"))
	if len(seen) != 3 || seen[2] != 3 || !strings.Contains(log.String(), "LD [M]  nvidia.o") {
		t.Fatalf("counted %v; log %q", seen, log.String())
	}
}
