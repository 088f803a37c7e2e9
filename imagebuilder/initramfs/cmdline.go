// Package initramfs is what gpurack-init, PID 1 of the image's initramfs, does: read
// the kernel command line, load modules, bring up the boot NIC with DHCP, fetch the
// root filesystem, refuse it unless its sha256 matches, mount it under a tmpfs overlay
// and switch_root to systemd. The command-line parsing is pure and fuzzed; the rest
// is thin Linux plumbing. It is not a general-purpose init: after switch_root, systemd
// owns the machine.
package initramfs

import (
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// PackedRootfs is where a rootfs packed into the initramfs lives (single-file boots).
const PackedRootfs = "/rootfs.squashfs"

// Kernel command-line keys gpurack-init reads (CONTRACTS §3).
const (
	KeyRootfs    = "gpurack.rootfs"
	KeyRootfsSum = "gpurack.rootfs.sha256"
	KeyBootIF    = "BOOTIF"
	KeyRetries   = "gpurack.rootfs.retries"
	KeyOnFail    = "gpurack.onfail"
	KeyInit      = "gpurack.init"
)

// OnFail is what gpurack-init does after it explains a failure.
type OnFail string

const (
	// FailReboot waits, then reboots, so the machine network-boots again: the default,
	// since most failures (a busy server, a link not yet up) are transient.
	FailReboot OnFail = "reboot"
	// FailPoweroff powers off (tests, and operators who want to look first).
	FailPoweroff OnFail = "poweroff"
	// FailHalt stops and keeps the message on the console.
	FailHalt OnFail = "halt"
)

// Config is what the kernel command line asks of gpurack-init.
type Config struct {
	// RootfsURL is gpurack.rootfs=: an http or https URL. Empty means the rootfs is
	// packed into the initramfs at PackedRootfs.
	RootfsURL string
	// RootfsSHA256 is the lowercase hex digest the rootfs must have.
	RootfsSHA256 string
	// BootMAC is the boot NIC from iPXE's BOOTIF=01-aa-bb-cc-dd-ee-ff, or nil.
	BootMAC net.HardwareAddr
	// Retries is how many times a download is tried before giving up.
	Retries int
	OnFail  OnFail
	// Init is what to exec in the new root.
	Init string
}

// Split splits a kernel command line into words the way the kernel does
// (lib/cmdline.c next_arg): words are separated by spaces, and double quotes group
// spaces into a word and are removed.
func Split(cmdline string) []string {
	var words []string
	var cur strings.Builder
	inQuote, have := false, false
	for _, r := range cmdline {
		switch {
		case r == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n' || r == '\r'):
			if have {
				words = append(words, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		words = append(words, cur.String())
	}
	return words
}

// ParseCmdline reads gpurack-init's settings from a kernel command line. Unknown words
// are ignored (they are the kernel's or systemd's); a gpurack.* value that is present
// but wrong is an error that says what to fix. The last occurrence of a key wins, as
// iPXE appends to the image's own command line.
func ParseCmdline(cmdline string) (*Config, error) {
	c := &Config{Retries: 8, OnFail: FailReboot, Init: "/sbin/init"}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	for _, w := range Split(cmdline) {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case KeyRootfs:
			c.RootfsURL = v
		case KeyRootfsSum:
			c.RootfsSHA256 = v
		case KeyBootIF:
			c.BootMAC = nil
			mac, err := parseBootIF(v)
			if err != nil {
				bad("BOOTIF=%q: %v", v, err)
				continue
			}
			c.BootMAC = mac
		case KeyRetries:
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1000 {
				bad("%s=%q: want a whole number of attempts from 1 to 1000", KeyRetries, v)
				continue
			}
			c.Retries = n
		case KeyOnFail:
			switch OnFail(v) {
			case FailReboot, FailPoweroff, FailHalt:
				c.OnFail = OnFail(v)
			default:
				bad("%s=%q: want reboot, poweroff or halt", KeyOnFail, v)
			}
		case KeyInit:
			if !strings.HasPrefix(v, "/") {
				bad("%s=%q: want an absolute path in the new root, such as /sbin/init", KeyInit, v)
				continue
			}
			c.Init = v
		}
	}
	if c.RootfsSHA256 == "" {
		bad("%s= is missing: gpurack-init boots only a rootfs whose digest it can check; use the image's cmdline file, which carries it", KeyRootfsSum)
	} else if b, err := hex.DecodeString(c.RootfsSHA256); err != nil || len(b) != 32 || strings.ToLower(c.RootfsSHA256) != c.RootfsSHA256 {
		bad("%s=%q: want 64 lowercase hex digits (the image's rootfs.squashfs sha256 from manifest.json)", KeyRootfsSum, c.RootfsSHA256)
	}
	if c.RootfsURL != "" {
		u, err := url.Parse(c.RootfsURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("%s=%q: want an http:// or https:// URL of rootfs.squashfs (gpuboot serves /images/<id>/rootfs.squashfs)", KeyRootfs, c.RootfsURL)
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("kernel command line: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// parseBootIF parses iPXE's BOOTIF value: a hardware type ("01" for Ethernet) and the
// MAC, all separated by '-'.
func parseBootIF(v string) (net.HardwareAddr, error) {
	parts := strings.Split(v, "-")
	if len(parts) != 7 || parts[0] != "01" {
		return nil, fmt.Errorf("want 01-aa-bb-cc-dd-ee-ff (hardware type 01, Ethernet, then the MAC), as iPXE's ${net0/mac:hexhyp} gives")
	}
	mac, err := net.ParseMAC(strings.Join(parts[1:], ":"))
	if err != nil {
		return nil, fmt.Errorf("the MAC: %v", err)
	}
	return mac, nil
}
