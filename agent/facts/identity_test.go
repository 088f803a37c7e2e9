package facts

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadIdentity(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(s), 0o644)
	}
	write("proc/cmdline", "initrd=initrd.img BOOTIF=01-AA-bb-cc-dd-ee-ff gpurack.enroll=10.0.0.1:8443 quiet\n")
	write("sys/class/dmi/id/product_uuid", "4C4C4544-0042-3510-8052-B4C04F4E4D32\n")
	write("sys/class/dmi/id/product_serial", "To Be Filled By O.E.M.\n")
	write("etc/os-release", "NAME=\"Debian\"\nGPURACK_IMAGE_ID=\"0123456789abcdef0123456789abcdef01234567\"\n")
	r := Root(root)
	id := r.ReadIdentity()
	want := Identity{BootMAC: "aa:bb:cc:dd:ee:ff", SMBIOSUUID: "4c4c4544-0042-3510-8052-b4c04f4e4d32"}
	if id != want {
		t.Errorf("identity %+v, want %+v (placeholder serial dropped)", id, want)
	}
	if v := r.CmdlineValue("gpurack.enroll"); v != "10.0.0.1:8443" {
		t.Errorf("gpurack.enroll = %q", v)
	}
	if v := r.ImageID(); v != "0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("image id %q", v)
	}
	// What gpuimage writes: /etc/gpurack/image-id (os-release gets only IMAGE_VERSION).
	write("etc/gpurack/image-id", "89abcdef0123456789abcdef0123456789abcdef\n")
	write("etc/os-release", "NAME=\"Debian\"\nIMAGE_ID=gpurack\nIMAGE_VERSION=89abcdef0123456789abcdef0123456789abcdef\n")
	if v := r.ImageID(); v != "89abcdef0123456789abcdef0123456789abcdef" {
		t.Errorf("image id %q from /etc/gpurack/image-id", v)
	}
}
