// Package facts reads what the agent reports about its own machine: identity
// (CONTRACTS §1) from /proc/cmdline and /sys/class/dmi/id, hostname, image id, boot id.
// Enrollment sends these; Status shows them.
package facts

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/gpurack/gpurack/internal/smbios"
)

// Identity is the machine identity of CONTRACTS §1.
type Identity struct {
	BootMAC, SMBIOSUUID, Serial string
}

// Root is prefixed to every path read (tests point it at a fake tree).
type Root string

func (r Root) read(p string) string {
	b, err := os.ReadFile(filepath.Join(string(r), p))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ReadIdentity reads the identity: BOOTIF= from the kernel command line, SMBIOS UUID
// (lowercased) and serial from /sys/class/dmi/id. Unreadable or placeholder values
// (internal/smbios) are empty.
func (r Root) ReadIdentity() Identity {
	var id Identity
	if u := strings.ToLower(r.read("sys/class/dmi/id/product_uuid")); !smbios.PlaceholderUUID(u) {
		id.SMBIOSUUID = u
	}
	if s := r.read("sys/class/dmi/id/product_serial"); !smbios.PlaceholderSerial(s) {
		id.Serial = s
	}
	for _, f := range strings.Fields(r.read("proc/cmdline")) {
		if v, ok := strings.CutPrefix(f, "BOOTIF="); ok {
			id.BootMAC = bootifMAC(v)
		}
	}
	return id
}

// bootifMAC turns "01-aa-bb-cc-dd-ee-ff" into "aa:bb:cc:dd:ee:ff".
func bootifMAC(v string) string {
	parts := strings.Split(strings.ToLower(v), "-")
	if len(parts) == 7 {
		parts = parts[1:]
	}
	if len(parts) != 6 {
		return ""
	}
	for _, p := range parts {
		if len(p) != 2 {
			return ""
		}
	}
	return strings.Join(parts, ":")
}

// CmdlineValue returns the value of key=VALUE on the kernel command line.
func (r Root) CmdlineValue(key string) string {
	for _, f := range strings.Fields(r.read("proc/cmdline")) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// ImageID is the id of the booted gpurack image: /etc/gpurack/image-id, which gpuimage
// writes (docs/imagebuilder.md), or else GPURACK_IMAGE_ID in /etc/os-release; empty
// outside a gpurack image.
func (r Root) ImageID() string {
	if id := r.read("etc/gpurack/image-id"); id != "" {
		return id
	}
	for _, l := range strings.Split(r.read("etc/os-release"), "\n") {
		if v, ok := strings.CutPrefix(l, "GPURACK_IMAGE_ID="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// BootID is /proc/sys/kernel/random/boot_id.
func (r Root) BootID() string { return r.read("proc/sys/kernel/random/boot_id") }

// Hostname is the kernel hostname.
func Hostname() string {
	h, _ := os.Hostname()
	return h
}

// Cmdline returns the kernel command line (/proc/cmdline); empty when unreadable.
func (r Root) Cmdline() string { return r.read("proc/cmdline") }
